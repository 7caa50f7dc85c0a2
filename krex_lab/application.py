"""What KREX's command-line applications (``krex arbiter``, ``krex pool``) share: config files
and logging, the traitlets way."""

from __future__ import annotations

import logging
from typing import Any

from traitlets import Unicode
from traitlets.config import Application


class KrexApplication(Application):
    """Loads ``<config_basename>.py``/``.json`` from the current directory and the Jupyter config
    path, then ``--config FILE``; sets up logging for the ``krex`` loggers."""

    #: the file name (without extension) searched for, e.g. "krex_arbiter_config"
    config_basename = "krex_config"

    config_file = Unicode("", help="A config file to load (Python or JSON).").tag(config=True)

    def initialize(self, argv: Any = None) -> None:
        super().initialize(argv)
        try:
            from jupyter_core.paths import jupyter_config_path

            search = [".", *jupyter_config_path()]
        except ImportError:
            search = ["."]
        self.load_config_file(self.config_basename, path=search)
        if self.config_file:
            self.load_config_file(self.config_file)
        level = int(self.log_level)  # type: ignore[call-overload]
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        logging.getLogger("krex").setLevel(level)
