"""What KREX's command-line applications (``krex arbiter``, ``krex pool``) share: config files,
logging, and their options on the ``krex`` argparse tree, the traitlets way.

An application's ``aliases`` and ``flags`` are the one list of its common options: ``krex``
declares them in argparse from there (:meth:`KrexApplication.add_arguments`) and hands what was
given back to traitlets (:meth:`KrexApplication.argv_from`), with any ``--Class.trait=value``
passed through unchanged.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable
from typing import Any, Literal, TypedDict

from traitlets import Container, HasTraits, TraitError, TraitType, Unicode
from traitlets.config import Application

#: a traitlets option passed through to the application as it is: ``--Class.trait=value``
TRAITLETS_OPTION = re.compile(r"--[A-Za-z_]\w*(\.[A-Za-z_]\w*)+=")

_METAVARS = {"Int": "N", "Float": "NUMBER", "Unicode": "TEXT", "Bool": "BOOL"}

#: the argparse dest of the traitlets options given after the declared ones
PASSED_THROUGH = "traitlets_options"


def _names(key: str | tuple[str, ...]) -> list[str]:
    return [key] if isinstance(key, str) else list(key)


def _option_strings(key: str | tuple[str, ...]) -> list[str]:
    return [f"-{n}" if len(n) == 1 else f"--{n}" for n in _names(key)]


def dest_of(key: str | tuple[str, ...]) -> str:
    """The argparse dest of an alias or flag: its (longest) name with ``-`` as ``_``."""
    return max(_names(key), key=len).replace("-", "_")


class _OptionArgs(TypedDict, total=False):
    """The keywords of ``parser.add_argument`` an alias is declared with: a list trait collects
    its values (``extend``), any other takes one, checked by ``type``."""

    dest: str
    default: None
    help: str
    action: Literal["extend"]
    nargs: Literal["+"]
    metavar: str
    type: Callable[[str], str]


def _checker(trait: TraitType[Any, Any], name: str, minimum: float | None = None) -> Callable[[str], str]:
    """An argparse ``type`` that checks a value as traitlets will (and against ``minimum``), and
    keeps the string as given."""

    def check(text: str) -> str:
        try:
            value = trait.from_string(text)
            validate = getattr(trait, "validate", None)
            if validate is not None:
                validate(None, value)
        except (TraitError, ValueError, SyntaxError) as exc:
            values = getattr(trait, "values", None)
            choices = f" (choose from {', '.join(map(str, values))})" if values else ""
            raise argparse.ArgumentTypeError(f"invalid {name} value: {text!r}{choices}") from exc
        if minimum is not None and value is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"invalid {name} value: {text!r} (at least {minimum:g})")
        return text

    check.__name__ = name
    return check


class KrexApplication(Application):
    """Loads ``<config_basename>.py``/``.json`` from the current directory and the Jupyter config
    path, then ``--config FILE``; sets up logging for the ``krex`` loggers."""

    #: the file name (without extension) searched for, e.g. "krex_arbiter_config"
    config_basename = "krex_config"

    config_file = Unicode("", help="A config file to load (Python or JSON).").tag(config=True)

    #: the smallest value an alias takes on the command line (a usage error below it), e.g.
    #: ``{"fake-gpus": 1}``
    minimums: dict[str, float] = {}

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

    # -- the application's options on the krex argparse tree ------------------------------------

    @classmethod
    def trait_of(cls, target: str) -> TraitType[Any, Any]:
        """The trait that an alias sets: ``"Arbiter.fake_gpus"`` -> ``Arbiter.fake_gpus``."""
        owner, _, name = target.rpartition(".")
        for klass in (cls, *cls.classes, *cls.mro()):
            if klass.__name__ == owner and issubclass(klass, HasTraits):
                trait = klass.class_traits().get(name)
                if trait is not None:
                    return trait
        raise KeyError(f"{cls.__name__}.aliases: no trait {target}")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Declare ``aliases`` and ``flags`` in ``parser`` (their help from the traits), and ``--help-all``."""
        for key, value in cls.aliases.items():
            target, help_text = (value, None) if isinstance(value, str) else value
            trait = cls.trait_of(target)
            text = (help_text or trait.help or "").strip()
            if not isinstance(trait, Container):
                text += f" (default: {trait.default_value!r}; {target})"
            kwargs: _OptionArgs = {
                "dest": dest_of(key),
                "default": None,
                "help": " ".join(text.split()).replace("%", "%%"),
            }
            if isinstance(trait, Container):
                kwargs.update({"action": "extend", "nargs": "+", "metavar": "VALUE"})
                kwargs["help"] += f" ({target})"
            else:
                kwargs["type"] = _checker(trait, type(trait).__name__.lower(), cls.minimums.get(_names(key)[0]))
                values = getattr(trait, "values", None)  # Enum's, or a trait's own (BackendName)
                if values:
                    kwargs["metavar"] = "{" + ",".join(str(v) for v in values) + "}"
                else:
                    kwargs["metavar"] = _METAVARS.get(type(trait).__name__, "VALUE")
            parser.add_argument(*_option_strings(key), **kwargs)
        for key, flag in cls.flags.items():
            parser.add_argument(
                *_option_strings(key), dest=dest_of(key), action="store_true", help=str(flag[1]).replace("%", "%%")
            )
        parser.add_argument("--version", action="version", version=f"%(prog)s {cls.version}")
        parser.add_argument(
            "--help-all", action="store_true", help="show every option of the application (its traitlets), then exit"
        )
        parser.set_defaults(**{PASSED_THROUGH: []})

    @classmethod
    def argv_from(cls, args: argparse.Namespace) -> list[str]:
        """The application's command line for what ``args`` holds: each alias given as
        ``--Class.trait=value``, each flag given as ``--flag``, then the passed-through options."""
        argv: list[str] = []
        for key, value in cls.aliases.items():
            target = value if isinstance(value, str) else value[0]
            given = getattr(args, dest_of(key), None)
            if given is not None:
                argv.extend(f"--{target}={v}" for v in (given if isinstance(given, list) else [given]))
        for key in cls.flags:
            if getattr(args, dest_of(key), False):
                argv.append(f"--{max(_names(key), key=len)}")
        if getattr(args, "help_all", False):
            argv.append("--help-all")
        argv.extend(getattr(args, PASSED_THROUGH, []))
        return argv
