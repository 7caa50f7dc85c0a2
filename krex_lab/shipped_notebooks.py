"""The notebooks shipped in ``notebooks/`` are kept without outputs, so that running them never
marks them modified in git.

Two paths lead there, both through :func:`strip`:

- the Jupyter server extension strips a shipped notebook as it is saved (:func:`pre_save_hook`):
  a run in `krex lab` saves back the very bytes git has, and ``git status`` stays clean; outputs
  worth keeping go in a copy (File > Save Notebook As..., any other name, even in ``notebooks/``);
- git's clean filter (``.gitattributes``, ``notebooks/strip_outputs.py``; ``make lab`` and ``make
  test`` configure it) strips what another editor saved before it reaches a commit.

Standard library only: git runs the filter with the system's ``python3``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

#: the checkout's shipped notebooks (an editable install's; elsewhere nothing matches)
SHIPPED = Path(__file__).resolve().parents[1] / "notebooks"

#: the notebooks git tracks there, by name: only these are saved stripped; any other file in the
#: folder (a Save As copy, a user's Untitled.ipynb) is the user's and keeps its outputs
SHIPPED_NAMES = frozenset(
    {
        "01_quickstart.ipynb",
        "02_optimize_a_kernel.ipynb",
        "03_dashboard.ipynb",
        "04_agent_study.ipynb",
    }
)


#: the kernelspecs the notebooks name, with the display name Jupyter writes for each on a save
#: (the installed kernelspec's), so that the stored one is what any save leaves
KERNEL_DISPLAY_NAMES = {"krex": "Python 3 (KREX)", "python3": "Python 3 (ipykernel)"}

#: cell metadata a run or the view leaves: timings, trust, how the (stripped) outputs were shown
RUN_CELL_METADATA = ("execution", "trusted", "scrolled", "collapsed")


# -- the parts of nbformat 4 and of jupyter_server's contents model read or written here ---------
# (total=False: a file on disk may lack any of them, so each is read with ``get``)


class Cell(TypedDict, total=False):
    cell_type: str
    source: str | list[str]
    metadata: dict[str, object]
    outputs: list[object]
    execution_count: int | None


class LanguageInfo(TypedDict, total=False):
    """A kernel's ``language_info`` (its ``kernel_info`` reply; stored in the notebook)."""

    name: str
    version: str
    mimetype: str
    file_extension: str
    pygments_lexer: str
    codemirror_mode: str | dict[str, object]
    nbconvert_exporter: str


class KernelSpecInfo(TypedDict, total=False):
    name: str
    display_name: str
    language: str


class NotebookMetadata(TypedDict, total=False):
    kernelspec: KernelSpecInfo
    language_info: LanguageInfo
    widgets: dict[str, object]


class Notebook(TypedDict, total=False):
    """A notebook's JSON."""

    cells: list[Cell]
    metadata: NotebookMetadata
    nbformat: int
    nbformat_minor: int


class ContentsModel(TypedDict, total=False):
    """What jupyter_server's contents manager reads and saves: a notebook's ``content`` is its JSON
    (a file's is text, a directory's its entries; None where the content was not asked for)."""

    type: str
    path: str
    content: Notebook | str | list[ContentsModel] | None


def _is_empty_code(cell: Cell) -> bool:
    source = cell.get("source", "")
    return cell.get("cell_type") == "code" and not "".join(source).strip()


def strip(nb: Notebook) -> Notebook:
    """``nb`` (a notebook's JSON, changed in place) without what a run and a save add: outputs,
    execution counts, cell timings, widget state, the kernel's version details, the empty code cells
    JupyterLab appends when the last cell is run (Shift+Enter), and the kernelspec's display name as
    the installed kernelspec spells it."""
    cells = nb.get("cells", [])
    while cells and _is_empty_code(cells[-1]):
        cells.pop()
    for cell in cells:
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        for key in RUN_CELL_METADATA:
            cell.get("metadata", {}).pop(key, None)
    meta = nb.get("metadata", {})
    meta.pop("widgets", None)
    if "language_info" in meta:
        meta["language_info"] = {"name": meta["language_info"].get("name", "python")}
    spec = meta.get("kernelspec")
    if isinstance(spec, dict) and spec.get("name") in KERNEL_DISPLAY_NAMES:
        spec["display_name"] = KERNEL_DISPLAY_NAMES[spec["name"]]
    return nb


def is_shipped(os_path: str | os.PathLike[str]) -> bool:
    path = Path(os_path).resolve()
    return path.name in SHIPPED_NAMES and path.parent == SHIPPED.resolve()


def pre_save_hook(model: ContentsModel, path: str, contents_manager: Any, **kwargs: Any) -> None:
    """jupyter_server's pre-save hook: a shipped notebook is saved stripped."""
    content = model.get("content")
    if model.get("type") != "notebook" or not isinstance(content, dict):
        return
    get_os_path = getattr(contents_manager, "_get_os_path", None)
    if get_os_path is not None and is_shipped(get_os_path(path)):
        strip(content)


_LANGUAGE_INFO: LanguageInfo = {}


def kernel_language_info() -> LanguageInfo:
    """What a Python kernel of this interpreter reports as ``language_info`` (jupyter_client runs a
    kernelspec's ``python`` as this server's ``sys.executable``), imported once, on first use."""
    if not _LANGUAGE_INFO:
        from ipykernel.ipkernel import IPythonKernel

        _LANGUAGE_INFO.update(IPythonKernel.language_info)  # type: ignore[typeddict-item]  # a dict[str, object] there
    return _LANGUAGE_INFO.copy()


def fill_for_the_view(model: ContentsModel, contents_manager: Any, path: str) -> None:
    """A shipped notebook as it is read by the lab: its stripped ``language_info`` filled in with what
    the kernel will report, so that JupyterLab, which writes the kernel's into the notebook when the
    kernel starts, finds nothing to change and does not mark it modified. A save strips it again."""
    content = model.get("content")
    if model.get("type") != "notebook" or not isinstance(content, dict):
        return
    get_os_path = getattr(contents_manager, "_get_os_path", None)
    if get_os_path is None or not is_shipped(get_os_path(path)):
        return
    meta = content.get("metadata", {})
    if meta.get("language_info") == {"name": "python"}:
        try:
            meta["language_info"] = kernel_language_info()
        except ImportError:  # no ipykernel here: the kernel runs elsewhere, and its info is unknown
            pass


def fill_on_read(contents_manager: Any) -> None:
    """Make ``contents_manager.get`` call :func:`fill_for_the_view` (jupyter_server has save hooks,
    no read hook); ``get`` is a coroutine in jupyter_server's async managers."""
    import inspect

    get = contents_manager.get

    def path_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return str(kwargs.get("path", args[0] if args else ""))

    if inspect.iscoroutinefunction(get):

        async def get_async(*args: Any, **kwargs: Any) -> Any:
            model = await get(*args, **kwargs)
            fill_for_the_view(model, contents_manager, path_of(args, kwargs))
            return model

        contents_manager.get = get_async
    else:

        def get_sync(*args: Any, **kwargs: Any) -> Any:
            model = get(*args, **kwargs)
            fill_for_the_view(model, contents_manager, path_of(args, kwargs))
            return model

        contents_manager.get = get_sync
