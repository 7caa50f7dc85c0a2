"""devsync runs on a session's control thread (a drain) while the main thread may be importing a
framework: it must never import, nor touch a module still being initialised.

Found on the H200 (2026-12-01): a warm worker drained while it imported numba.cuda ended with a
partial package (``_DeadlockError`` on one thread, "no attribute 'datamodel'" in every later job).
The framework here is a stand-in package named ``numba`` with the same import cycle as
numba-cuda's driver and devices modules, imported slowly in a real child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from krex_lab.workers.context.reset import preload

REPO = Path(__file__).resolve().parents[1]

FAKE_NUMBA = {
    "numba/__init__.py": "",
    "numba/config.py": "ENABLE_CUDASIM = False\n",
    "numba/cuda/__init__.py": "from .cudadrv import driver\n",
    "numba/cuda/cudadrv/__init__.py": "",
    # the driver is slow to import and needs devices, which needs the driver: numba-cuda's cycle
    "numba/cuda/cudadrv/driver.py": "import time\ntime.sleep(0.3)\nfrom . import devices\n",
    "numba/cuda/cudadrv/devices.py": textwrap.dedent(
        """\
        import threading
        IMPORTED_BY = threading.current_thread().name
        from . import driver
        class _Gpus:
            pass
        class _Runtime:
            gpus = _Gpus()
        _runtime = _Runtime()
        """
    ),
}

CHILD = textwrap.dedent(
    """\
    import json, sys, threading, time
    from krex_lab import devsync
    errors, done = [], threading.Event()
    def drain():
        while not done.is_set():
            try:
                devsync.synchronize_frameworks()
            except BaseException as exc:
                errors.append(f"drain: {type(exc).__name__}: {exc}")
            time.sleep(0.001)
    t = threading.Thread(target=drain, name="drain")
    t.start()
    time.sleep(0.05)
    try:
        import numba.cuda
        whole = hasattr(numba.cuda, "cudadrv") and hasattr(numba.cuda.cudadrv, "devices")
        by = sys.modules["numba.cuda.cudadrv.devices"].IMPORTED_BY
    except BaseException as exc:
        errors.append(f"main: {type(exc).__name__}: {exc}")
        whole, by = False, None
    done.set()
    t.join()
    print(json.dumps({"errors": errors, "whole": whole, "imported_by": by}))
    """
)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _run_child(root: Path, package: dict[str, str], code: str) -> Any:
    """``code`` in a fresh python that imports the stand-in ``package`` (written under ``root``);
    the JSON of its last line."""
    _write(root, package)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=root)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_drain_during_a_framework_import_imports_nothing_and_leaves_it_whole(tmp_path: Path) -> None:
    seen = _run_child(tmp_path, FAKE_NUMBA, CHILD)
    assert seen == {"errors": [], "whole": True, "imported_by": "MainThread"}, seen


def test_a_failed_preload_leaves_no_partial_package_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(
        tmp_path,
        {
            "halfpkg/__init__.py": "import halfdep\nfrom . import part\nraise RuntimeError('broke halfway')\n",
            "halfpkg/part.py": "VALUE = 1\n",
            "halfdep.py": "",  # what the package imports on the way, whole: it stays
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        loaded, skipped, _ = preload(["halfpkg"], False, False)
        assert loaded == [] and skipped == {"halfpkg": "RuntimeError: broke halfway"}
        assert not [m for m in sys.modules if m.split(".")[0] == "halfpkg"]
        assert "halfdep" in sys.modules
        # Mended (a job's own import, later): the package comes back whole, its submodule bound.
        (tmp_path / "halfpkg/__init__.py").write_text("from . import part\n")
        import importlib

        importlib.invalidate_caches()
        assert importlib.import_module("halfpkg").part.VALUE == 1
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] in ("halfpkg", "halfdep")]:
            del sys.modules[name]


# numba-cuda's layout (0.2x, the H200's numba 0.68): the device list caches ``lst`` in a
# functools.cache, not on the instance; Driver and Device turn any unknown attribute into a driver call.
NUMBA_CUDA_LAYOUT = {
    "numba/__init__.py": "",
    "numba/cuda/__init__.py": "from .cudadrv import driver, devices\ngpus = devices.gpus\n",
    "numba/cuda/cudadrv/__init__.py": "",
    "numba/cuda/cudadrv/driver.py": textwrap.dedent(
        """\
        import threading
        CALLS = []  # driver calls made through the lazy attributes
        _current = threading.local()  # CUDA's per-thread context stack
        class Context:
            def __init__(self):
                self.synced = 0
            def push(self):
                _current.stack = [*getattr(_current, "stack", []), self]
            def pop(self):
                assert _current.stack.pop() is self
            def synchronize(self):  # cuCtxSynchronize: the calling thread's current context
                if not getattr(_current, "stack", None):
                    raise RuntimeError("CUDA_ERROR_INVALID_CONTEXT")
                self.synced += 1
        class Device:
            def __init__(self, devnum):
                self.id = devnum
                self.primary_context = None
            def __getattr__(self, attr):
                CALLS.append(f"cuDeviceGetAttribute({attr})")
                return 0
            def get_primary_context(self):
                if self.primary_context is None:
                    self.primary_context = Context()
                return self.primary_context
        class Driver:
            def __init__(self):
                self.devices = {}
            def __getattr__(self, fname):
                CALLS.append(fname)  # numba: ensure_initialized() (cuInit), then the call
                raise AttributeError(fname)
            def get_device(self, devnum=0):
                return self.devices.setdefault(devnum, Device(devnum))
        driver = Driver()
        """
    ),
    "numba/cuda/cudadrv/devices.py": textwrap.dedent(
        """\
        import functools
        from .driver import driver
        class _DeviceList:
            @property
            @functools.cache
            def lst(self):
                return [driver.get_device(0)]
        gpus = _DeviceList()
        """
    ),
}

CONTEXT_CHILD = textwrap.dedent(
    """\
    import json, threading
    import numba.cuda
    from numba.cuda.cudadrv import driver
    from krex_lab import devsync
    def on_control_thread(fn):  # where a drain runs
        out = []
        t = threading.Thread(target=lambda: out.append(fn()))
        t.start()
        t.join()
        return out[0]
    before = [on_control_thread(devsync.synchronize_frameworks), devsync.numba_context() is None]
    ctx = numba.cuda.gpus.lst[0].get_primary_context()  # what a first kernel launch does
    ctx.push()  # current on the main thread only
    after = on_control_thread(devsync.synchronize_frameworks)
    print(json.dumps({"before": before, "after": after, "synced": ctx.synced, "calls": driver.CALLS}))
    """
)


def test_a_numba_cuda_context_is_found_and_synchronised_without_a_driver_call(tmp_path: Path) -> None:
    """On the H200 a numba session's context was never found (its device list keeps no ``lst``
    attribute), so a drain never synchronised it. The drain's thread is not the one where the
    context is current; a context that does not exist is not created."""
    seen = _run_child(tmp_path, NUMBA_CUDA_LAYOUT, CONTEXT_CHILD)
    assert seen == {"before": [[], True], "after": ["numba"], "synced": 1, "calls": []}, seen


class _Queue:
    """numba's ``_PendingDeallocs`` as far as a free is concerned: queued, then done on clear()."""

    def __init__(self, freed: list[str]) -> None:
        self.items: list[str] = []
        self.freed = freed

    def add_item(self, what: str) -> None:
        self.items.append(what)

    def clear(self) -> None:
        self.freed.extend(self.items)
        self.items.clear()


def test_numba_free_pending_frees_the_memory_managers_queue_too() -> None:
    # numba-cuda's Context has its own queue (streams, events, modules) and its memory manager has
    # another, where a device array's free waits (numba_cuda/.../cudadrv/driver.py: _alloc_finalizer
    # adds to memory_manager.deallocations). The pool's reset cleared only the first; on the H200 a
    # job's few hundred MiB stayed allocated and the worker was recycled (2026-12-02).
    from types import SimpleNamespace

    from krex_lab.devsync import numba_free_pending

    freed: list[str] = []
    ctx = SimpleNamespace(deallocations=_Queue(freed), memory_manager=SimpleNamespace(deallocations=_Queue(freed)))
    ctx.deallocations.add_item("stream")
    ctx.memory_manager.deallocations.add_item("array of 400 MiB")
    numba_free_pending(ctx)
    assert sorted(freed) == ["array of 400 MiB", "stream"]
    assert not ctx.deallocations.items and not ctx.memory_manager.deallocations.items
    # an older numba without a separate manager queue: the context's alone, once
    old = SimpleNamespace(deallocations=_Queue([]))
    old.deallocations.add_item("array")
    numba_free_pending(old)
    assert old.deallocations.freed == ["array"]
