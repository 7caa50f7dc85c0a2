"""The pool of context workers, end to end: real arbiter (fake backend, 2 GPUs), real pool,
real worker processes, real signals and sockets. One pool serves the whole module: 2 active
workers and 1 spare per GPU, no framework preloaded (the numba test has a pool of its own)."""

from __future__ import annotations

import ast
import concurrent.futures
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import krex_lab
from krex_lab.errors import WorkerDied
from krex_lab.procutil import proc_state
from krex_lab.pytest_plugin import ArbiterProc, cpu_gain, running_arbiter, wait_for
from krex_lab.workers.client import PoolClient
from krex_lab.workers.results import JobResult, RemoteTraceback
from krex_lab.workers.wire import PoolTable
from tests.support.pool import PoolProc, alive, krex_run, python_run, shell_code
from tests.support.procs import Procs


@pytest.fixture(scope="module")
def arb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArbiterProc]:
    base = tmp_path_factory.mktemp("arb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KREX_POOL_ENDPOINT", f"ipc://{base / 'rt' / 'pool.sock'}")
        yield from running_arbiter(base, mp, gpus=2)


@pytest.fixture(scope="module")
def pool(arb: ArbiterProc) -> Iterator[PoolProc]:
    p = PoolProc(
        arb.env(),
        f"ipc://{arb.runtime / 'pool.sock'}",
        "--no-preload",
        "--workers-per-gpu=2",
        "--spares=1",
        "--Pool.interrupt_grace=1.0",
        "--debug",
        log=arb.runtime / "pool.log",
    )
    p.start()
    yield p
    p.stop()


@pytest.fixture
def client(pool: PoolProc) -> PoolClient:
    pool.wait_ready()
    return pool.client


@pytest.fixture
def env(pool: PoolProc) -> dict[str, str]:
    return dict(pool.env)


class Collect:
    def __init__(self) -> None:
        self.chunks: list[tuple[float, str, str]] = []

    def __call__(self, stream: str, text: str) -> None:
        self.chunks.append((time.monotonic(), stream, text))

    def text(self, stream: str = "stdout") -> str:
        return "".join(t for _, s, t in self.chunks if s == stream)


# -- scripts: streaming, exit codes, tracebacks ------------------------------------------------------


def test_script_output_streams_while_it_runs(client: PoolClient, tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text(
        "import sys, time\nprint('first', flush=True)\nprint('err1', file=sys.stderr)\n"
        "time.sleep(1.0)\nprint('second')\n"
    )
    out = Collect()
    t0 = time.monotonic()
    result = client.run_script(script, on_output=out)
    t_end = time.monotonic()
    assert result.ok and result.exit_code == 0, result
    first = next(t for t, s, text in out.chunks if "first" in text)
    err1 = next(t for t, s, text in out.chunks if s == "stderr" and "err1" in text)
    assert first - t0 < t_end - t0 - 0.7, "'first' arrived only at the end"
    assert err1 < t_end - 0.7
    assert out.text() == "first\nsecond\n" and out.text("stderr") == "err1\n"


def test_krex_run_streams_in_the_terminal(env: dict[str, str], client: PoolClient, tmp_path: Path) -> None:
    script = tmp_path / "stream.py"
    script.write_text("import time\nprint('first', flush=True)\ntime.sleep(1.0)\nprint('second')\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "run", str(script)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "first\n"
    t_first = time.monotonic()
    assert proc.poll() is None, "the first line came only when the command ended"
    assert proc.stdout.read() == "second\n"
    assert proc.wait(10) == 0
    assert time.monotonic() - t_first > 0.6


SCRIPTS = {
    "ok.py": "import sys\nprint('out')\nprint('err', file=sys.stderr)\n",
    "exit5.py": "import sys\nprint('bye')\nsys.exit(5)\n",
    "exitmsg.py": "import sys\nsys.exit('a message for stderr')\n",
    "chained.py": (
        "def inner(d):\n    return d['missing']\n\ndef outer():\n    try:\n        inner({})\n"
        "    except KeyError as exc:\n        raise ValueError('bad input') from exc\n\nouter()\n"
    ),
    "syntax.py": "print('never')\ndef f(:\n    pass\n",
    "kbd.py": "print('before')\nraise KeyboardInterrupt\n",
    "args.py": (
        "import os, sys\nprint(sys.argv[1:], os.getcwd(), os.environ.get('KREX_TEST_VAR'), __name__)\n"
        "print(os.path.basename(__file__), sys.path[0] == os.path.dirname(os.path.abspath(__file__)))\n"
    ),
}


def test_krex_run_gives_what_python_gives(env: dict[str, str], client: PoolClient, tmp_path: Path) -> None:
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(text)
    env = {**env, "KREX_TEST_VAR": "from-the-caller"}
    for name in SCRIPTS:
        args = [str(tmp_path / name), "one", "--gpu", "7"]
        want = python_run(env, *args, cwd=tmp_path)
        got = krex_run(env, *args, cwd=tmp_path)
        assert shell_code(got.returncode) == shell_code(want.returncode), (name, got.stderr)
        assert got.stdout == want.stdout, name
        assert got.stderr == want.stderr, name


def test_krex_run_exclusive_prints_the_region_report(env: dict[str, str], client: PoolClient, tmp_path: Path) -> None:
    (tmp_path / "timed.py").write_text("import krex_lab.client as c\nprint(c.current_session().gpu)\n")
    r = krex_run(env, "--exclusive", "--gpu", "1", str(tmp_path / "timed.py"))
    assert r.returncode == 0 and r.stdout == "1\n", r.stderr
    assert "KREX region" in r.stderr and "on GPU 1 [simulated GPU]" in r.stderr


def test_exceptions_carry_the_remote_traceback(client: PoolClient, tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text("def f():\n    raise RuntimeError('boom')\nf()\n")
    result = client.run_script(tmp_path / "boom.py")
    assert not result.ok and result.exit_code == 1 and result.status == "exception"
    assert result.error == "RuntimeError: boom"
    assert result.traceback is not None
    assert result.traceback.startswith("Traceback (most recent call last):\n")
    assert f'File "{tmp_path / "boom.py"}", line 2, in f' in result.traceback
    assert "runpy" not in result.traceback and "krex_lab" not in result.traceback
    cell = client.run_code("x = 1\n1 / 0\n")
    assert cell.error == "ZeroDivisionError: division by zero"
    assert cell.traceback is not None and "<krex-cell-" in cell.traceback and "1 / 0" in cell.traceback


def test_edited_modules_are_reloaded_between_runs(env: dict[str, str], client: PoolClient, tmp_path: Path) -> None:
    (tmp_path / "cand.py").write_text("VALUE = 1\n")
    (tmp_path / "main.py").write_text("import cand\nprint(cand.VALUE)\n")
    assert krex_run(env, str(tmp_path / "main.py")).stdout == "1\n"
    (tmp_path / "cand.py").write_text("VALUE = 22\n")
    assert krex_run(env, str(tmp_path / "main.py")).stdout == "22\n"


# -- crashes ------------------------------------------------------------------------------------------


def _deaths(status: PoolTable) -> int:
    return status.counters.get("deaths", 0)


@pytest.mark.parametrize(
    ("code", "cause", "exit_code"),
    [
        (
            "import ctypes\nprint('about to segfault', flush=True)\nctypes.string_at(0)",
            "SIGSEGV (segmentation fault)",
            128 + signal.SIGSEGV,
        ),
        ("import os\nprint('about to exit', flush=True)\nos._exit(3)", "exited with code 3", 3),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL (killed)", 128 + signal.SIGKILL),
    ],
)
def test_a_crash_costs_a_worker_not_a_result(
    pool: PoolProc, client: PoolClient, code: str, cause: str, exit_code: int
) -> None:
    before = pool.status()
    size = len(pool.worker_pids(status=before))
    out = Collect()
    result = client.run_code(code, gpu=0, on_output=out)
    assert not result.ok and result.status == "died", result
    assert result.error is not None and result.error.startswith(f"worker died: {cause}"), result.error
    assert result.exit_code == exit_code
    assert result.worker_pid is not None and not alive(result.worker_pid)
    if "segfault" in code:
        assert result.traceback is not None and "Segmentation fault" in result.traceback
        assert "about to segfault" in out.text()
    after = pool.wait_ready()
    assert len(pool.worker_pids(status=after)) == size
    assert _deaths(after) == _deaths(before) + 1
    assert client.run_code("6 * 7", gpu=0).value == "42"


def test_100_jobs_with_random_crashes_get_100_matched_results(pool: PoolProc, client: PoolClient) -> None:
    rng = random.Random(20261129)
    kinds = ["ok"] * 100
    for i in rng.sample(range(100), 15):
        kinds[i] = rng.choice(["segv", "exit", "kill"])
    codes = {
        "ok": "import time\nprint('job {i}', flush=True)\ntime.sleep({d})\n{i} * 2",
        "segv": "import ctypes\nprint('job {i}', flush=True)\nctypes.string_at(0)",
        "exit": "import os\nprint('job {i}', flush=True)\nos._exit(7)",
        "kill": "import os, signal\nprint('job {i}', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)",
    }
    deaths_before = _deaths(pool.status())
    outputs: dict[int, Collect] = {i: Collect() for i in range(100)}

    def one(i: int) -> JobResult:
        return client.run_code(codes[kinds[i]].format(i=i, d=0.005 * (i % 4)), on_output=outputs[i])

    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        results = list(ex.map(one, range(100)))
    assert len(results) == 100
    assert len({r.job_id for r in results}) == 100
    expect_error = {"segv": "SIGSEGV", "exit": "exited with code 7", "kill": "SIGKILL"}
    for i, (kind, r) in enumerate(zip(kinds, results)):
        assert f"job {i}\n" in outputs[i].text(), (i, outputs[i].chunks)
        assert outputs[i].text().count("job ") == 1, (i, outputs[i].chunks)
        if kind == "ok":
            assert r.ok and r.value == str(2 * i), (i, r)
        else:
            assert r.status == "died" and expect_error[kind] in (r.error or ""), (i, kind, r)
    after = pool.wait_ready(60)
    assert _deaths(after) - deaths_before == 15
    assert len(pool.worker_pids(status=after)) == 6


# -- namespaces, leases, resets -----------------------------------------------------------------------


def test_namespace_persists_in_a_lease_and_is_reset_between_leases(client: PoolClient) -> None:
    a = client.run_code("import sys\nx = 41\nsys.argv.append('dirty')", lease="nb-1")
    b = client.run_code("x + 1", lease="nb-1")
    assert a.ok and b.value == "42" and a.worker_pid == b.worker_pid
    other = client.run_code("'x' in dir()")
    assert other.value == "False" and other.worker_pid != a.worker_pid  # a leased worker serves only its lease
    client.release_lease("nb-1")
    c = client.run_code("x", lease="nb-1")
    assert c.status == "exception" and c.error == "NameError: name 'x' is not defined"
    d = client.run_code("import sys\nsys.argv.count('dirty')", lease="nb-1")
    assert d.value == "0"
    client.release_lease("nb-1")
    assert client.run_code("y = 5").ok and client.run_code("'y' in dir()").value == "False"


def test_what_a_job_changes_in_loaded_modules_does_not_reach_the_next_job(client: PoolClient) -> None:
    # `python SCRIPT.py` starts with pristine modules: a job that rebinds, deletes or adds names of
    # modules the worker had loaded, or seeds `random`, must not change what the next job sees.
    patch = (
        "import json, random, builtins\njson.dumps = None\ndel json.loads\nbuiltins.krex_leak = 1\n"
        "random.seed(0)\nimport os\nos.getpid()"
    )
    patched = client.run_code(patch, lease="leaky", gpu=0)
    assert patched.ok, patched.error
    client.release_lease("leaky")  # its worker is reset and takes ordinary jobs again
    check = (
        "import json, random\n"
        "(json.dumps([1]), hasattr(json, 'loads'), 'krex_leak' in dir(__builtins__) "
        "if isinstance(__builtins__, type(json)) else 'krex_leak' in __builtins__, random.random())"
    )
    for _ in range(40):  # until one lands on the patched worker (any idle worker of GPU 0 takes it)
        r = client.run_code(check, gpu=0)
        assert r.ok, r.error
        if r.worker_pid == patched.worker_pid:
            break
    else:
        pytest.fail("no job ran on the patched worker again")
    dumped, has_loads, leaked, drawn = ast.literal_eval(r.value or "")
    assert (dumped, has_loads, leaked) == ("[1]", True, False), r.value
    assert drawn != random.Random(0).random(), "random was left seeded"


def test_a_worker_that_cannot_be_reset_is_recycled(pool: PoolProc, client: PoolClient) -> None:
    r = client.run_code("import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()")
    assert r.ok
    wait_for(lambda: not alive(r.worker_pid or 0), timeout=10)
    s = client.run_code("raise RuntimeError('CUDA error: an illegal memory access was encountered')")
    assert s.status == "exception"
    wait_for(lambda: not alive(s.worker_pid or 0), timeout=10)
    status = pool.wait_ready()
    assert status.counters["recycled"] >= 2


# -- interrupts and timeouts --------------------------------------------------------------------------


def test_interrupt_stops_the_job_and_the_worker_survives(
    pool: PoolProc, env: dict[str, str], client: PoolClient, tmp_path: Path
) -> None:
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n")
    before = pool.status()
    proc = subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "run", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "sleeping\n"
    running = pool.status().running
    assert len(running) == 1
    worker = running[0].pid
    time.sleep(0.3)  # into time.sleep (line 3): right after the print it may still be flushing
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130
    assert err.startswith("Traceback (most recent call last):\n") and err.endswith("KeyboardInterrupt\n")
    assert 'sleepy.py", line 3' in err and "runner.py" not in err, err
    assert alive(worker)
    after = pool.wait_ready()
    assert worker in pool.worker_pids(status=after)
    assert _deaths(after) == _deaths(before)


CLIENT_THAT_DIES = """
from krex_lab.workers.client import PoolClient
pool = PoolClient.connect(start=False)
print(pool.run_code("x = 1", lease="dying").ok, flush=True)
pool.run_code("import time\\nprint('busy', flush=True)\\ntime.sleep(60)")
"""


def test_a_client_that_dies_takes_its_jobs_and_leases_with_it(
    pool: PoolProc, env: dict[str, str], client: PoolClient
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT_THAT_DIES], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "True\n"
    assert proc.stdout.readline() == "busy\n"
    status = pool.status()
    assert [le.lease for le in status.leases] == ["dying"] and len(status.running) == 1
    worker = status.running[0].pid
    proc.kill()
    proc.wait()
    wait_for(lambda: not (s := pool.status()).running and not s.leases, timeout=10)
    assert alive(worker)  # interrupted, not killed
    pool.wait_ready()


def test_timeouts_interrupt_then_kill(pool: PoolProc, client: PoolClient) -> None:
    t0 = time.monotonic()
    r = client.run_code("while True:\n    pass", timeout=0.5)
    assert r.status == "timeout" and r.error == "timed out after 0.5 s", r
    assert r.traceback is not None and "KeyboardInterrupt" in r.traceback
    assert alive(r.worker_pid or 0)
    stubborn = (
        "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass"
    )
    s = client.run_code(stubborn, timeout=0.5)
    assert s.status == "timeout" and "its worker was killed" in (s.error or ""), s
    assert not alive(s.worker_pid or 0)
    assert time.monotonic() - t0 < 10
    pool.wait_ready()


# -- functions ------------------------------------------------------------------------------------------


def _square(x: int) -> int:
    return x * x


def _gpu_of_worker() -> str:
    return os.environ["KREX_GPU"]


def _fail() -> None:
    {}["nope"]


def test_call_and_submit(client: PoolClient) -> None:
    assert client.call(_square, 7) == 49
    assert client.call(_gpu_of_worker, gpu=1) == "1"
    with pytest.raises(KeyError) as info:
        client.call(_fail)
    assert isinstance(info.value.__cause__, RemoteTraceback) and "_fail" in info.value.__cause__.tb
    with pytest.raises(WorkerDied, match="exited with code 9"):
        client.call(os._exit, 9)
    futures = [krex_lab.submit(_square, i) for i in range(8)]
    assert [f.result(timeout=30) for f in futures] == [i * i for i in range(8)]


# -- regions inside jobs --------------------------------------------------------------------------------

EXCLUSIVE_JOB = """
import time, krex_lab
with krex_lab.exclusive() as region:
    print("granted", region.id, time.time(), flush=True)
    time.sleep(1.5)
    print("end", time.time(), flush=True)
"""


def test_exclusive_in_a_job_freezes_gpu0_and_holds_its_jobs(
    arb: ArbiterProc, pool: PoolProc, client: PoolClient
) -> None:
    procs = Procs(arb.env())
    try:
        sibling = procs.start("sibling", "0")
        out = Collect()
        results: dict[str, JobResult] = {}

        def run(name: str, **kw: Any) -> None:
            results[name] = client.run_code(kw.pop("code"), **kw)

        holder = threading.Thread(
            target=run, args=("holder",), kwargs={"code": EXCLUSIVE_JOB, "gpu": 0, "on_output": out}
        )
        holder.start()
        wait_for(lambda: "granted" in out.text(), timeout=10)
        t_granted = time.time()
        table = arb.status()["gpus"][0]
        holder_pid = table["holder"]["pid"]
        workers0 = pool.worker_pids(gpu=0)
        assert holder_pid in workers0  # the worker is the region's holder
        roles = {s["pid"]: s["role"] for s in table["sessions"]}
        assert all(roles.get(p) == "worker" for p in workers0)  # workers are the arbiter's sessions
        others = [p for p in workers0 if p != holder_pid]
        assert len(others) == 2
        assert all(proc_state(p) in ("T", "t") for p in others)  # the other workers of GPU 0: frozen
        assert cpu_gain(sibling.pid, 0.3) < 0.03  # another session of GPU 0: frozen
        assert pool.status().gpus[0].gate == "closed"
        waiting = [
            threading.Thread(target=run, args=(f"gpu0-{i}",), kwargs={"code": "import time\ntime.time()", "gpu": 0})
            for i in range(2)
        ]
        busy1 = threading.Thread(target=run, args=("gpu1",), kwargs={"code": "2 + 2", "gpu": 1})
        for t in [*waiting, busy1]:
            t.start()
        busy1.join(5)
        assert not busy1.is_alive()
        holder.join(15)
        for t in waiting:
            t.join(15)
        t_end = float(out.text().split("end ")[1].split()[0])
        assert results["holder"].ok, results["holder"]
        assert results["gpu1"].finished_at is not None and results["gpu1"].finished_at < t_end  # GPU 1 kept going
        for i in range(2):
            r = results[f"gpu0-{i}"]
            assert r.ok and r.submitted_at is not None and r.dispatched_at is not None
            assert r.submitted_at < t_end, "submitted while the region was held"
            assert r.dispatched_at > t_end, "the pool started a GPU 0 job inside another's region"
        assert t_granted < t_end
        assert cpu_gain(sibling.pid, 0.5) > 0.05  # thawed
        assert all(proc_state(p) not in ("T", "t") for p in others)
    finally:
        procs.cleanup()


def test_exclusive_flag_runs_the_job_inside_a_region(client: PoolClient) -> None:
    r = client.run_code("import krex_lab\nkrex_lab.client.current_session().gpu", gpu=1, exclusive=True)
    assert r.ok and r.value == "1", r
    assert r.region is not None and r.region["gpu"] == 1 and r.region["holder_pid"] == r.worker_pid
    assert r.region["simulated"] is True


def test_exclusive_flag_freezes_the_other_workers_though_the_client_started_the_pool(
    pool: PoolProc, client: PoolClient
) -> None:
    # The region exempts the waiting client's tree; this client (the test) started the pool, so
    # that tree would hold every worker if it did not stop at sessions (the workers are sessions).
    pool.wait_ready(60)
    r = client.run_code("1", gpu=0, exclusive=True)
    assert r.ok and r.region is not None, r
    others = [p for p in pool.worker_pids(gpu=0) if p != r.worker_pid]
    assert others and set(others) <= set(r.region["frozen"]), r.region
