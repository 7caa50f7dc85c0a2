"""What a new user hits with the pool: a job from inside a region (``krex exclusive -- krex run``,
``--exclusive`` nested in it), stdin, no arbiter, an on-demand pool after its arbiter stopped."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from krex_lab.pytest_plugin import ArbiterProc, running_arbiter, wait_for
from tests.support import ROOT
from tests.support.pool import PoolProc, alive, krex_run


@pytest.fixture(scope="module")
def arb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArbiterProc]:
    with pytest.MonkeyPatch.context() as mp:
        yield from running_arbiter(tmp_path_factory.mktemp("arb"), mp, gpus=1)


def _pool(arb: ArbiterProc, name: str, *args: str, timeout: float = 90) -> Iterator[PoolProc]:
    proc = PoolProc(arb.env(), f"ipc://{arb.runtime / name}.sock", *args, log=arb.runtime / f"{name}.log")
    proc.start(timeout=timeout)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def pool(arb: ArbiterProc) -> Iterator[PoolProc]:
    yield from _pool(arb, "newuser", "--no-preload", "--workers-per-gpu=1", "--spares=1")


@pytest.fixture(scope="module")
def torch_pool(arb: ArbiterProc) -> Iterator[PoolProc]:
    """A pool whose worker preloads torch, and so keeps an evaluation's zygote."""
    pytest.importorskip("torch")
    yield from _pool(arb, "torch", "--preload=torch", "--workers-per-gpu=1", "--spares=0", timeout=180)


def _env(arb: ArbiterProc, pool: PoolProc) -> dict[str, str]:
    return {**arb.env(), "KREX_POOL_ENDPOINT": pool.endpoint}


def test_krex_run_inside_krex_exclusive_runs_and_nests(arb: ArbiterProc, pool: PoolProc, tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text("print('inside', flush=True)\n")
    inner = f"{sys.executable} -m krex_lab.cli run"
    script = (
        f"{inner} {tmp_path / 's.py'} && {inner} --exclusive {tmp_path / 's.py'} && "
        f"{inner} --exclusive --gpu 0 {tmp_path / 's.py'}"
    )
    env = _env(arb, pool)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "krex_lab.cli", "exclusive", "--max-hold", "120", "--", "sh", "-c", script],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"krex exclusive -- krex run hangs: {exc.stderr!r}\n{pool.log()}")
    assert r.returncode == 0, (r.stderr, pool.log())
    assert r.stdout == "inside\n" * 3
    # --exclusive inside it nests: both inner reports are the outer region's (no second region)
    regions = re.findall(r"KREX region (\S+) on GPU", r.stderr)
    assert len(regions) == 4 and len(set(regions)) == 1, r.stderr
    pool.wait_ready()  # the region's workers are gone, the pool's own are back and serve
    assert pool.client.run_code("1").ok


def test_a_false_region_claim_does_not_join_it(arb: ArbiterProc, pool: PoolProc, tmp_path: Path) -> None:
    """KREX_REGION in the environment of a process outside the region: the arbiter refuses it."""
    marker = tmp_path / "region"
    env = _env(arb, pool)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "krex_lab.cli",
            "exclusive",
            "--quiet",
            "--max-hold",
            "60",
            "--",
            "sh",
            "-c",
            f'echo "$KREX_REGION" > {marker}.tmp && mv {marker}.tmp {marker} && sleep 60',
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # SIGTERM reaches the shell, which ends without its sleep: the group goes at the end
        start_new_session=True,
    )
    try:
        wait_for(marker.exists, 20)
        region = marker.read_text().strip()
        assert region
        (tmp_path / "s.py").write_text("print('ran')\n")
        try:
            r = krex_run({**env, "KREX_REGION": region}, str(tmp_path / "s.py"), timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the job of a false claim neither joined the region nor failed")
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert r.stdout == ""
        assert "could not join that region" in r.stderr and "not inside region" in r.stderr, r.stderr
    finally:
        holder.terminate()
        holder.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)  # the sleep the shell left
    pool.wait_ready()


def test_stdin_reaches_the_script(arb: ArbiterProc, pool: PoolProc, tmp_path: Path) -> None:
    (tmp_path / "cat.py").write_text(
        "import sys, os\nprint(repr(sys.stdin.read()))\nprint(repr(os.read(0, 10)))\nprint(sys.stdin.isatty())\n"
    )
    out: list[str] = []
    r = pool.client.run_script(
        tmp_path / "cat.py", stdin=b"hi\nthere\n", on_output=lambda s, t: out.append(t) if s == "stdout" else None
    )
    assert r.ok, r
    assert "".join(out) == "'hi\\nthere\\n'\nb''\nFalse\n"
    out.clear()
    r = pool.client.run_script(tmp_path / "cat.py", on_output=lambda s, t: out.append(t) if s == "stdout" else None)
    assert r.ok and "".join(out) == "''\nb''\nFalse\n"  # none given: /dev/null, as before


def test_read_stdin_reads_a_pipe_and_nothing_else(tmp_path: Path) -> None:
    code = "from krex_lab.workers.client.pool_client import read_stdin; print(repr(read_stdin()))"
    piped = subprocess.run(
        [sys.executable, "-c", code], input="hi\n", capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert piped.stdout == "b'hi\\n'\n", piped.stderr
    null = subprocess.run(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert null.stdout == "None\n", null.stderr


def test_echo_into_krex_run(arb: ArbiterProc, pool: PoolProc, tmp_path: Path) -> None:
    (tmp_path / "cat.py").write_text("import sys\nprint(sys.stdin.read().upper(), end='')\n")
    r = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "run", str(tmp_path / "cat.py")],
        env=_env(arb, pool),
        input="hi\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout == "HI\n", r.stderr


def test_a_late_pipe_is_said_on_stderr(arb: ArbiterProc, pool: PoolProc, tmp_path: Path) -> None:
    # `(sleep 2; echo late) | krex run s.py`: the script reads nothing, and krex run says why (2 s: a
    # loaded machine takes more than 0.3 s to start krex run).
    (tmp_path / "s.py").write_text("import sys\nprint(repr(sys.stdin.read()))\n")
    krex = f"{sys.executable} -m krex_lab.cli run {tmp_path / 's.py'}"
    r = subprocess.run(
        ["sh", "-c", f"(sleep 2; echo late) | {krex}"],
        env=_env(arb, pool),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == "''\n", r.stderr
    assert re.search(r"^krex run: stdin is a pipe that had nothing to read within 50 ms", r.stderr, re.M), r.stderr
    on_time = subprocess.run(
        ["sh", "-c", f"echo now | {krex}"], env=_env(arb, pool), capture_output=True, text=True, timeout=60
    )
    assert on_time.stdout == repr("now\n") + "\n" and "stdin" not in on_time.stderr, on_time.stderr


def test_without_an_arbiter_a_run_says_it_is_unprotected(tmp_path: Path) -> None:
    """No arbiter on the node: every plain ``krex run`` says so in one line on stderr (no GPU
    exclusivity, no regions), not only the pool's log; ``--exclusive``, which needs one, says so in
    its own one line and runs nothing."""
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    nobody = f"ipc://{runtime / 'nobody.sock'}"
    env = {**ArbiterProc(runtime).env(), "KREX_ENDPOINT": nobody}
    pool = PoolProc(env, f"ipc://{runtime / 'pool.sock'}", "--no-preload", "--spares=0", log=runtime / "pool.log")
    pool.start(timeout=90)
    try:
        (tmp_path / "s.py").write_text("print('ok')\n")
        for _ in range(2):  # every run, not only the first
            r = krex_run(pool.env, str(tmp_path / "s.py"))
            assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
            assert r.stderr == (
                f"krex run: no KREX arbiter answers at {nobody}: this run has no GPU exclusivity and regions are "
                "unavailable; start one with `krex arbiter`\n"
            ), r.stderr
        quiet = krex_run({**pool.env, "KREX_QUIET": "1"}, str(tmp_path / "s.py"))
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
        r = krex_run(pool.env, "--exclusive", str(tmp_path / "s.py"))
        assert r.returncode != 0 and r.stdout == "", (r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("krex run: --exclusive: "), r.stderr
        assert nobody in r.stderr, r.stderr
        # without an arbiter the pool asks the node's GPU library itself (the fake backend here)
        assert "no GPU backend either" not in pool.log(), pool.log()
        assert pool.client.info is not None and pool.client.info.backend == "fake"
    finally:
        pool.stop()


def test_on_demand_pool_exits_soon_after_its_arbiter_stops(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, gpus=1).start()
    env = {**arb.env(), "KREX_POOL_IDLE_EXIT": "600"}
    pool = PoolProc(
        env, f"ipc://{runtime / 'od.sock'}", "--on-demand", "--no-preload", "--spares=0", log=runtime / "od.log"
    )
    try:
        pool.start(timeout=90)
        assert pool.proc is not None
        assert pool.client.run_code("1").ok
        arb.stop()
        t0 = time.monotonic()
        wait_for(lambda: pool.proc is not None and pool.proc.poll() is not None, 15)
        assert time.monotonic() - t0 < 10, pool.log()
        assert pool.proc.returncode == 0
        # Its log (at the default level) says why it exited, in one line.
        said = [line for line in pool.log().splitlines() if "exiting" in line]
        assert len(said) == 1 and "has stopped answering" in said[0], pool.log()
    finally:
        arb.stop()
        pool.stop()


def test_a_pool_with_a_live_arbiter_stays(arb: ArbiterProc, pool: PoolProc) -> None:
    time.sleep(1.0)
    assert pool.proc is not None and alive(pool.proc.pid)


def test_a_pipe_held_open_without_data_does_not_hang_krex_run(arb: ArbiterProc, pool: PoolProc, tmp_path: Path) -> None:
    # An agent's or an IDE's shell may hand `krex run` a pipe it never writes to nor closes.
    (tmp_path / "s.py").write_text("print('ran')\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "run", str(tmp_path / "s.py")],
        env=_env(arb, pool),
        stdin=subprocess.PIPE,  # held open, never written
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ran\n"
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()


HOLDER_USES_ITS_POOL = """
import time, krex_lab
from krex_lab.workers.client import PoolClient

pool = PoolClient.connect(start=False)
with krex_lab.exclusive(gpu=0, max_hold=60) as region:
    t0 = time.monotonic()
    r = pool.run_code("import os; print('ran', os.getpid(), flush=True); 6 * 7", timeout=15)
    print("result", r.ok, r.value, r.status, round(time.monotonic() - t0, 1), flush=True)
"""


def test_the_holder_own_pool_jobs_run_inside_its_region(arb: ArbiterProc, pool: PoolProc) -> None:
    """``exclusive()`` in a process without KREX_REGION (its own region, held in-process): a PoolClient job
    runs in that region (it used to go to a worker the region froze, and hang until its timeout)."""
    env = _env(arb, pool)
    env.pop("KREX_REGION", None)
    r = subprocess.run(
        [sys.executable, "-c", HOLDER_USES_ITS_POOL], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, (r.stderr, pool.log())
    assert "ran " in r.stdout and "result True 42 ok" in r.stdout, (r.stdout, r.stderr, pool.log())
    pool.wait_ready()  # the region's worker is gone, the pool's own serve again
    assert pool.client.run_code("1").ok


ZYGOTE = "krex_lab.evaluate.candidate.zygote"


def zygotes(pool: PoolProc) -> list[int]:
    assert pool.proc is not None
    found = []
    for p in psutil.Process(pool.proc.pid).children(recursive=True):
        try:
            if any(ZYGOTE in part for part in p.cmdline()):
                found.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_timed_out_run_prints_its_one_line_and_nothing_else(
    arb: ArbiterProc, torch_pool: PoolProc, tmp_path: Path
) -> None:
    """The interrupt that ends a timed-out job went to the worker's whole process group, the
    zygote too: it died of a KeyboardInterrupt, its traceback streaming into the job's stderr (a
    lone ``Traceback (most recent call last):`` when the client ended first)."""
    before = zygotes(torch_pool)
    assert before, torch_pool.log()
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(60)\n")
    env = {**arb.env(), "KREX_POOL_ENDPOINT": torch_pool.endpoint}
    for _ in range(3):
        out = krex_run(env, "--timeout", "0.5", str(script), cwd=tmp_path)
        assert out.returncode == 124, out.stderr
        assert out.stderr == "krex run: timed out after 0.5 s\n" and out.stdout == "", out.stderr
        assert zygotes(torch_pool) == before, "the job's interrupt reached the worker's zygote"


def _torch_settings() -> tuple[bool, str, bool, int]:
    import torch

    return (
        torch.are_deterministic_algorithms_enabled(),
        str(torch.get_default_dtype()),
        torch.is_grad_enabled(),
        torch.get_num_threads(),
    )


def _change_torch_settings() -> tuple[bool, str, bool, int]:
    import torch

    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    return _torch_settings()


def test_a_jobs_torch_settings_do_not_reach_the_next_job(torch_pool: PoolProc) -> None:
    """The reset puts back what a job changed of torch's process-wide settings, and only that (the
    first call of some, made needlessly, cost every worker's first reset over a second)."""
    client = torch_pool.client
    before = client.call(_torch_settings)
    changed = client.call(_change_torch_settings)
    assert changed[:3] == (True, "torch.float64", False) and changed != before
    assert client.call(_torch_settings) == before
