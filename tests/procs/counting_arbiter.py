"""``krex arbiter`` whose fake backend logs every GPU query: one line ``TIME KIND`` per call of
``inventory`` or ``processes`` to ``$KREX_COUNT_FILE`` (the dashboard tests count them).

    python -m tests.procs.counting_arbiter [krex arbiter options...]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from krex_lab import cli
from krex_lab.gpu.fake import FakeBackend


def _counted(name: str) -> None:
    original = getattr(FakeBackend, name)
    path = os.environ["KREX_COUNT_FILE"]

    def wrapper(self: FakeBackend, *args: Any) -> Any:
        with open(path, "a") as f:
            f.write(f"{time.time():.6f} {name}\n")
        return original(self, *args)

    setattr(FakeBackend, name, wrapper)


if __name__ == "__main__":
    _counted("inventory")
    _counted("processes")
    cli.main(["arbiter", *sys.argv[1:]])
