"""The server extension on a real jupyter_server (pytest-jupyter): handlers, metrics, auth,
base_url, and the embedded arbiter and pool it starts and stops.

The pytest-jupyter fixtures are imported into this module only (not registered as a global
plugin), so their autouse event-loop fixtures touch no other test module; the tests are plain
functions that drive the server's loop themselves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pytest_jupyter.jupyter_server import *  # noqa: F403 - the jp_* fixtures, for this module only
from tornado.httpclient import HTTPClientError

from krex_lab.procutil import proc_state
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from krex_lab.serverext.processes import pool_available
from tests.support import ROOT
from tests.support.procs import Procs

URLS = ["krex/api/status", "krex/api/sessions", "krex/api/regions", "krex/metrics", "krex/api/spec.json"]


@pytest.fixture
def krex_config(arbiter: ArbiterProc) -> dict[str, Any]:
    return {"endpoint": arbiter.endpoint, "start_pool": False, "watch_interval": 0}


@pytest.fixture
def jp_server_config(krex_config: dict[str, Any]) -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"krex_lab.serverext": True}}, "KrexExtensionApp": krex_config}


@pytest.fixture
def get(jp_fetch: Any, jp_asyncio_loop: Any) -> Any:
    """GET a server path (relative to base_url); returns (code, headers, body)."""

    def fetch(path: str, **kwargs: Any) -> tuple[int, Any, bytes]:
        try:
            r = jp_asyncio_loop.run_until_complete(jp_fetch(path, **kwargs))
        except HTTPClientError as exc:
            assert exc.response is not None
            return exc.code, exc.response.headers, exc.response.body or b""
        return r.code, r.headers, r.body

    return fetch


def get_json(get: Any, path: str, **kwargs: Any) -> Any:
    code, headers, body = get(path, **kwargs)
    assert code == 200, body
    assert headers["Content-Type"].startswith("application/json")
    return json.loads(body)


def metrics(get: Any) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted labels: value} of one scrape."""
    code, headers, body = get("krex/metrics")
    assert code == 200, body
    assert headers["Content-Type"].startswith("text/plain")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_status_json(jp_serverapp: Any, get: Any, arbiter: ArbiterProc) -> None:
    data = get_json(get, "krex/api/status")
    assert data["arbiter"]["simulated"] is True and data["arbiter"]["backend"] == "fake"
    assert [g["index"] for g in data["gpus"]] == [0, 1]
    assert data["arbiter"]["pid"] == arbiter.proc.pid  # type: ignore[union-attr]
    assert data["server"]["endpoint"] == arbiter.endpoint
    assert data["server"]["embedded_arbiter"] is None, "an arbiter answered: none embedded"
    assert os.environ["KREX_ENDPOINT"] == arbiter.endpoint, "exported for the kernels"


def test_sessions_json(jp_serverapp: Any, get: Any, procs: Procs) -> None:
    sib = procs.start("sibling", "1", "--sleep")
    holder = procs.start("holder", "0", wait_line="granted")
    sessions = {s["pid"]: s for s in get_json(get, "krex/api/sessions")["sessions"]}
    assert sessions[sib.pid]["gpu"] == 1 and sessions[sib.pid]["name"] == "test-sibling"
    assert sessions[sib.pid]["holding"] is False
    assert sessions[holder.pid]["holding"] is True and sessions[holder.pid]["gpu"] == 0


def test_regions_json(jp_serverapp: Any, get: Any, procs: Procs) -> None:
    sib = procs.start("sibling", "0", "--sleep")
    for _ in range(2):
        holder = procs.start("holder", "0", "--hold", "0.05", wait_line="granted")
        assert procs.readline(holder).startswith("released")
    regions = get_json(get, "krex/api/regions")["regions"]
    assert len(regions) == 2
    last = regions[-1]
    assert last["gpu"] == 0 and last["frozen"] == [sib.pid] and last["simulated"] is True
    assert last["hold_s"] >= 0.05 and last["released_by"] == "released by holder"
    assert len(get_json(get, "krex/api/regions", params={"limit": "1"})["regions"]) == 1
    assert get("krex/api/regions", params={"limit": "x"})[0] == 400


def test_the_openapi_document_names_every_route_and_describes_what_each_answers(
    jp_serverapp: Any, get: Any, procs: Procs
) -> None:
    from jsonschema import Draft202012Validator

    from krex_lab.serverext.handlers import default_handlers

    spec = get_json(get, "krex/api/spec.json")
    assert spec["openapi"].startswith("3.1") and spec["info"]["version"]
    assert set(spec["paths"]) == {route for route, _ in default_handlers}
    procs.start("sibling", "1", "--sleep")
    holder = procs.start("holder", "0", "--hold", "0.05", wait_line="granted")
    assert procs.readline(holder).startswith("released")
    procs.start("holder", "0", wait_line="granted")  # one holding now: the status has a holder row
    for path in ("krex/api/status", "krex/api/sessions", "krex/api/regions"):
        schema = spec["paths"]["/" + path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        # the document's own references resolve against it: #/components/schemas/...
        validator = Draft202012Validator({**schema, "components": spec["components"]})
        body = get_json(get, path)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]
        assert not errors, (path, errors[:5])
    # and the document says what it would refuse: a GPU that is not a number, a frozen pid that is text
    regions = spec["paths"]["/krex/api/regions"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    validator = Draft202012Validator({**regions, "components": spec["components"]})
    good = get_json(get, "krex/api/regions")
    for field, value in (("gpu", "zero"), ("frozen", ["1234"])):
        bad = json.loads(json.dumps(good))
        bad["regions"][0][field] = value
        assert not validator.is_valid(bad), field


def test_metrics_text(jp_serverapp: Any, get: Any, procs: Procs) -> None:
    from krex_lab.client import Exclusive, Session

    procs.start("sibling", "0", "--sleep")
    procs.start("sibling", "1", "--sleep")
    holder = procs.start("holder", "0", "--hold", "0.05", wait_line="granted")
    assert procs.readline(holder).startswith("released")
    holder = procs.start("holder", "0", wait_line="granted")
    # A waiter for GPU 0 (registered on GPU 1: a newcomer on GPU 0 would be frozen at once).
    session = Session(gpu=1, name="waiter")
    waiter = Exclusive(gpu=0, session=session)
    thread = threading.Thread(target=waiter.acquire, daemon=True)
    thread.start()
    g0 = (("gpu", "0"), ("name", "Simulated GPU 0 (fake backend)"))
    g1 = (("gpu", "1"), ("name", "Simulated GPU 1 (fake backend)"))
    try:
        wait_for(lambda: metrics(get)["krex_gpu_queue_length"][g0] == 1)
        m = metrics(get)
        assert m["krex_arbiter_up"][()] == 1
        assert m["krex_arbiter_info"][(("backend", "fake"), ("lock_capable", "false"), ("simulated", "true"))] == 1
        assert m["krex_gpu_sessions"][g0] == 2 and m["krex_gpu_sessions"][g1] == 2
        assert m["krex_gpu_holder_present"][g0] == 1 and m["krex_gpu_holder_present"][g1] == 0
        assert m["krex_gpu_queue_length"][g1] == 0 and m["krex_gpu_gate_closed"][g0] == 1
        assert m["krex_gpu_memory_total_bytes"][g0] == 80 * 2**30
        completed = (("gpu", "0"), ("outcome", "completed"))
        assert m["krex_regions_total"][completed] == 1
        assert m["krex_region_frozen_processes_total"][(("gpu", "0"),)] == 1
        assert m["krex_region_wait_seconds_count"][(("gpu", "0"),)] == 1
        assert m["krex_region_acquire_seconds_count"][(("gpu", "0"),)] == 1
        assert m["krex_region_hold_seconds_sum"][(("gpu", "0"),)] >= 0.05
        holder.kill()
        thread.join(5)
        assert waiter.id is not None, "granted once the holder died"
        waiter.release()
        # Each region is counted once, however many scrapes see it in the history.
        wait_for(lambda: metrics(get)["krex_regions_total"][completed] == 3)
        m = metrics(get)
        assert m["krex_regions_total"][completed] == 3 and m["krex_region_wait_seconds_count"][(("gpu", "0"),)] == 3
        assert m["krex_gpu_holder_present"][g0] == 0 and m["krex_gpu_queue_length"][g0] == 0
    finally:
        session.close()


def test_token_required(
    jp_serverapp: Any, jp_asyncio_loop: Any, http_server_client: Any, jp_base_url: str, get: Any
) -> None:
    for path in URLS:
        url = jp_base_url + path
        for headers in ({}, {"Authorization": "token not-the-token"}):
            r = jp_asyncio_loop.run_until_complete(http_server_client.fetch(url, headers=headers, raise_error=False))
            assert r.code in (401, 403), (url, headers, r.code)
            assert b"krex" not in (r.body or b"").lower(), "nothing of the node leaks"
        assert get(path)[0] == 200, "and with the token it answers"


@pytest.mark.parametrize("jp_base_url", ["/user/alice/lab/", "/"])
def test_base_url(
    jp_serverapp: Any, jp_asyncio_loop: Any, http_server_client: Any, jp_auth_header: Any, get: Any, jp_base_url: str
) -> None:
    assert jp_serverapp.base_url == jp_base_url
    for path in URLS:
        assert get(path)[0] == 200
        if jp_base_url != "/":
            r = jp_asyncio_loop.run_until_complete(
                http_server_client.fetch("/" + path, headers=jp_auth_header, raise_error=False)
            )
            assert r.code == 404, "handlers live under base_url only"


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh KREX runtime dir where no arbiter runs (short path: ipc socket names are limited)."""
    path = tempfile.mkdtemp(prefix="krex-x-")
    monkeypatch.setenv("KREX_RUNTIME_DIR", path)
    monkeypatch.delenv("KREX_ENDPOINT", raising=False)
    monkeypatch.delenv("KREX_POOL_ENDPOINT", raising=False)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def no_arbiter(runtime: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("KREX_ENDPOINT", f"ipc://{runtime}/nobody.sock")
    return runtime


@pytest.mark.parametrize("krex_config", [{"embedded": False, "start_pool": False, "watch_interval": 0}])
def test_no_arbiter_503(no_arbiter: str, jp_serverapp: Any, get: Any) -> None:
    code, _, body = get("krex/api/status")
    assert code == 503 and b"no KREX arbiter answers" in body
    assert get("krex/api/sessions")[0] == 503
    m = metrics(get)
    assert m["krex_arbiter_up"][()] == 0


def _session_proc(runtime: str, endpoint: str, code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "KREX_RUNTIME_DIR": runtime, "KREX_ENDPOINT": endpoint, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("ready")
    return proc


@pytest.mark.parametrize(
    "krex_config",
    [
        {
            "backend": "fake",
            "fake_gpus": 3,
            "watch_interval": 0,
            "start_pool": pool_available(),
            "pool_args": ["--no-preload"],
        }
    ],
)
def test_embedded_arbiter_and_pool_stop_with_server(
    runtime: str, jp_serverapp: Any, jp_asyncio_loop: Any, get: Any
) -> None:
    data = get_json(get, "krex/api/status")
    server = data["server"]
    assert server["embedded_arbiter"] == data["arbiter"]["pid"]
    assert len(data["gpus"]) == 3 and data["arbiter"]["simulated"] is True
    endpoint = os.environ["KREX_ENDPOINT"]
    assert endpoint == server["endpoint"] == f"ipc://{runtime}/arbiter.sock"
    arbiter = psutil.Process(server["embedded_arbiter"])
    pool = psutil.Process(server["pool"]) if server["pool"] else None
    if pool_available():
        assert pool is not None, server["problems"]
    # A region held while the server stops: its sibling must not stay frozen.
    sibling = _session_proc(
        runtime, endpoint, "import krex_lab, time; krex_lab.attach(gpu=0); print('ready', flush=True); time.sleep(60)"
    )
    holder = _session_proc(
        runtime,
        endpoint,
        "import krex_lab, time\nwith krex_lab.exclusive(gpu=0):\n    print('ready', flush=True); time.sleep(60)",
    )
    try:
        wait_for(lambda: proc_state(sibling.pid) == "T")
        left = [*([pool, *pool.children(recursive=True)] if pool else []), arbiter, *arbiter.children(recursive=True)]
        t0 = time.monotonic()
        jp_asyncio_loop.run_until_complete(jp_serverapp.cleanup_extensions())
        assert time.monotonic() - t0 < 8
        for p in left:
            assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE, f"left behind: {p}"
        wait_for(lambda: proc_state(sibling.pid) in ("S", "R"))
        assert "KREX_ENDPOINT" not in os.environ and "KREX_POOL_ENDPOINT" not in os.environ, "restored"
    finally:
        for p in (sibling, holder):
            p.kill()
            p.wait()


@pytest.mark.skipif(not pool_available(), reason="needs the pool service")
@pytest.mark.parametrize("krex_config", [{"start_pool": True, "pool_args": ["--no-preload"], "watch_interval": 0}])
def test_dead_pool_is_started_again(
    arbiter: ArbiterProc, krex_config: dict[str, Any], jp_serverapp: Any, get: Any
) -> None:
    app = jp_serverapp.extension_manager.extension_points["krex_lab"].app
    first = get_json(get, "krex/api/status")["server"]["pool"]
    assert first, app.services.problems
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not app.services.pool.alive())
    app.services.check()  # what the periodic watch does
    second = get_json(get, "krex/api/status")["server"]["pool"]
    assert second and second != first and "pool_up 1.0" in get("krex/metrics")[2].decode()


@pytest.fixture
def pool_already_serving(arbiter: ArbiterProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A pool of this user that serves before the server starts (one `krex run` started on demand)."""
    from tests.support.pool import PoolProc

    endpoint = f"ipc://{arbiter.runtime / 'pool.sock'}"
    monkeypatch.setenv("KREX_POOL_ENDPOINT", endpoint)
    pool = PoolProc(arbiter.env(), endpoint, "--no-preload", "--spares=0", log=tmp_path / "pool.log").start(90)
    yield pool
    pool.stop()


@pytest.mark.skipif(not pool_available(), reason="needs the pool service")
@pytest.mark.parametrize("krex_config", [{"start_pool": True, "pool_args": ["--no-preload"], "watch_interval": 0}])
def test_a_pool_already_serving_is_used_not_restarted(
    capfd: pytest.CaptureFixture[str],
    pool_already_serving: Any,
    krex_config: dict[str, Any],
    jp_serverapp: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = jp_serverapp.extension_manager.extension_points["krex_lab"].app
    ours = app.services.pool
    if ours is not None and ours.proc is not None:
        ours.proc.wait(30)  # it steps aside: another pool holds the endpoint's lock
    for _ in range(3):
        app.services.check()  # what the periodic watch does
    assert not [r for r in caplog.records if "starting it again" in r.getMessage()], "no restart loop"
    assert app.services.pool is None and not app.services.problems
    # One line says which pool serves (none started, then found to be someone else's).
    said = capfd.readouterr().err.splitlines()  # the server's log, from its start
    assert not [m for m in said if "started pool service" in m], said
    assert len([m for m in said if "using the pool already serving" in m]) == 1, said


def test_a_shipped_notebook_is_saved_without_outputs(
    jp_serverapp: Any, get: Any, jp_root_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run a shipped notebook in the lab and save it: the file is byte for byte what git has."""
    from krex_lab import shipped_notebooks

    shipped = jp_root_dir / "notebooks"
    shipped.mkdir()
    original = (ROOT / "notebooks" / "01_quickstart.ipynb").read_bytes()
    (shipped / "01_quickstart.ipynb").write_bytes(original)
    monkeypatch.setattr(shipped_notebooks, "SHIPPED", shipped)
    nb = json.loads(original)
    for n, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):  # as a run leaves it
        cell["execution_count"] = n + 1
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": f"ran {n}\n"}]
        cell["metadata"]["execution"] = {"iopub.status.idle": "2026-12-03T08:00:00Z"}
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.99.0", "file_extension": ".py"}
    # Shift+Enter on the last cell: JupyterLab appends an empty code cell
    empty = {"cell_type": "code", "execution_count": None, "id": "e0", "metadata": {}, "outputs": [], "source": ""}
    nb["cells"].append(empty)
    saved = json.dumps({"type": "notebook", "format": "json", "content": nb})
    # Save As beside it, and the user's own notebook there, are the user's: they keep their outputs
    others = ("mine.ipynb", "notebooks/01_quickstart-with-outputs.ipynb", "notebooks/Untitled.ipynb")
    for where in ("notebooks/01_quickstart.ipynb", *others):
        code, _, body = get(f"api/contents/{where}", method="PUT", body=saved)
        assert code in (200, 201), body
    assert (shipped / "01_quickstart.ipynb").read_bytes() == original
    # Read back, it carries what its kernel will report, so opening it changes nothing in the view
    code, _, body = get("api/contents/notebooks/01_quickstart.ipynb")
    assert code == 200 and json.loads(body)["content"]["metadata"]["language_info"]["version"], body
    for where in others:
        mine = json.loads((jp_root_dir / where).read_text())
        first = next(c for c in mine["cells"] if c["cell_type"] == "code")
        assert "".join(first["outputs"][0]["text"]) == "ran 0\n", where
        assert mine["cells"][-1]["id"] == "e0"


def test_the_shipped_names_are_the_notebooks_git_tracks() -> None:
    """Only the tracked notebooks are saved stripped: the list of names is git's list."""
    from krex_lab.shipped_notebooks import SHIPPED_NAMES

    tracked = subprocess.run(
        ["git", "ls-files", "notebooks/*.ipynb"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert {Path(p).name for p in tracked} == SHIPPED_NAMES
