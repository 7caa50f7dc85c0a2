"""The ``krex`` command's parsers: a subcommand's unknown argument is its own error (its usage, exit
2, with the nearest option suggested), its arguments are added when it is first used (building the
tree imports nothing heavy), and a traitlets application's ``--Class.trait=value`` options pass
through. The tree itself is :mod:`krex_lab.cli`'s."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["AppLoader", "AppMain", "AppOptions", "CommandParser", "SuggestingParser"]


#: an application subcommand's entry point: ``main(argv)`` of a traitlets application
AppMain = Callable[[list[str]], None]


class AppOptions(Protocol):
    """What the tree needs of an application class (see :class:`krex_lab.application.KrexApplication`)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def argv_from(self, args: argparse.Namespace) -> list[str]: ...


AppLoader = Callable[[], tuple[AppOptions, AppMain]]


def _did_you_mean(word: str, known: Sequence[str]) -> str:
    """``"; did you mean exclusive?"`` for a near miss of one of ``known`` (else "")."""
    import difflib  # only on an error's way out

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, sized without ``shutil`` (which it imports for the terminal's width
    whenever a parser is made: shutil brings bz2, lzma and more to every ``krex run``)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        if width is None:
            try:
                columns = int(os.environ.get("COLUMNS", "")) or os.get_terminal_size(1).columns
            except (ValueError, OSError, AttributeError):
                columns = 80
            width = columns - 2
        super().__init__(prog, indent_increment, max_help_position, width)


class SuggestingParser(argparse.ArgumentParser):
    """A parser that answers a mistyped choice (``krex exclusiv``) or option (``--josn``) with the
    nearest one it knows (Python 3.11's argparse does not)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            if not isinstance(value, str) or action.choices is None:
                raise
            hint = _did_you_mean(value, [str(c) for c in action.choices])
            raise argparse.ArgumentError(action, f"{exc.message}{hint}") from None

    def unknown_hint(self, rest: Sequence[str]) -> str:
        options = [o for a in self._actions for o in a.option_strings]
        first = next((a.split("=", 1)[0] for a in rest if a.startswith("--")), "")
        return _did_you_mean(first, options) if first else ""


class CommandParser(SuggestingParser):
    """A subcommand's parser: an argument it does not know is its own error (its usage, exit 2).

    ``populate`` adds the arguments when the parser is first used (parsing or help), so that
    building the tree imports nothing heavy. ``app_options`` (arbiter, pool): arguments of the
    form ``--Class.trait=value`` are kept, in order, as the ``traitlets_options`` of the result.
    ``keep_unknown``: the dest that unknown arguments are put in front of (``lab``: JupyterLab's).
    """

    def __init__(
        self,
        *args: Any,
        populate: Callable[[argparse.ArgumentParser], None] | None = None,
        app_options: bool = False,
        keep_unknown: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._populate = populate
        self._app_options = app_options
        self._keep_unknown = keep_unknown

    def _ensure_populated(self) -> None:
        populate, self._populate = self._populate, None
        if populate is not None:
            populate(self)

    def format_usage(self) -> str:
        self._ensure_populated()
        return super().format_usage()

    def format_help(self) -> str:
        self._ensure_populated()
        return super().format_help()

    def parse_known_args(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        self._ensure_populated()
        result, rest = super().parse_known_args(args, namespace)
        if self._keep_unknown is not None:
            setattr(result, self._keep_unknown, [*rest, *getattr(result, self._keep_unknown, [])])
            return result, []
        if self._app_options:
            from .application import PASSED_THROUGH, TRAITLETS_OPTION

            passed = [a for a in rest if TRAITLETS_OPTION.match(a)]
            rest = [a for a in rest if not TRAITLETS_OPTION.match(a)]
            setattr(result, PASSED_THROUGH, [*getattr(result, PASSED_THROUGH, []), *passed])
        if rest:
            hint = " (options of the application: --Class.trait=value)" if self._app_options else ""
            self.error(f"unrecognized arguments: {' '.join(rest)}{self.unknown_hint(rest)}{hint}")
        return result, []
