"""Progress of a batch of evaluations: an ipywidgets bar in a notebook, tqdm in a terminal when it
is installed, else one plain line (rewritten in place on a terminal, every 10% otherwise).
Everything is imported lazily, when a bar is made."""

from __future__ import annotations

import sys
from typing import Any, Protocol


class Progress(Protocol):
    def update(self, n: int = 1, *, failed: bool = False, retried: bool = False) -> None: ...
    def close(self) -> None: ...


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class _Counts:
    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc = total, desc
        self.done = self.failed = self.retried = 0

    def count(self, n: int, failed: bool, retried: bool) -> None:
        self.done += n
        self.failed += n if failed else 0
        self.retried += n if retried else 0

    def postfix(self) -> str:
        return f"failed {self.failed}, retried {self.retried}"


class PlainProgress(_Counts):
    """``desc: 120/300 (40%) failed 0, retried 3``: in place on a terminal, else every 10%."""

    def __init__(self, total: int, desc: str, stream: Any = None) -> None:
        super().__init__(total, desc)
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._step = max(1, total // 10)

    def _line(self) -> str:
        pct = 100 * self.done / self.total if self.total else 100.0
        return f"{self.desc}: {self.done}/{self.total} ({pct:.0f}%) {self.postfix()}"

    def update(self, n: int = 1, *, failed: bool = False, retried: bool = False) -> None:
        before = self.done
        self.count(n, failed, retried)
        if self.tty:
            self.stream.write("\r" + self._line())
            self.stream.flush()
        elif self.done // self._step != before // self._step or self.done == self.total:
            print(self._line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class TqdmProgress(_Counts):
    def __init__(self, total: int, desc: str) -> None:
        super().__init__(total, desc)
        import tqdm

        self.bar = tqdm.tqdm(total=total, desc=desc, unit="eval")

    def update(self, n: int = 1, *, failed: bool = False, retried: bool = False) -> None:
        self.count(n, failed, retried)
        self.bar.set_postfix_str(self.postfix(), refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


class WidgetProgress(_Counts):
    def __init__(self, total: int, desc: str) -> None:
        super().__init__(total, desc)
        import ipywidgets
        from IPython.display import display

        self.bar = ipywidgets.IntProgress(value=0, min=0, max=max(1, total), description=desc[:20])
        self.label = ipywidgets.Label(f"0/{total}")
        display(ipywidgets.HBox([self.bar, self.label]))

    def update(self, n: int = 1, *, failed: bool = False, retried: bool = False) -> None:
        self.count(n, failed, retried)
        self.bar.value = self.done
        self.label.value = f"{self.done}/{self.total} {self.postfix()}"

    def close(self) -> None:
        self.bar.bar_style = "danger" if self.failed else "success"


def make_progress(total: int, desc: str = "krex evaluations") -> Progress:
    """The bar that fits where this runs (see the module's docstring)."""
    if _in_notebook():
        try:
            return WidgetProgress(total, desc)
        except ImportError:
            pass
    if sys.stderr.isatty():
        try:
            return TqdmProgress(total, desc)
        except ImportError:
            pass
    return PlainProgress(total, desc)
