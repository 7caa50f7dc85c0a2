"""``krex run``'s short way (a plain UNIX socket, the standard library): a real arbiter (fake
backend, 2 GPUs) and a real pool, ``python -m krex_lab.command run`` (the installed ``krex``)
against ``python -m krex_lab.cli run`` (the full way) on the same scripts: the same stdout,
stderr and exit code, Ctrl-C as the full way, and a way back to the full path whenever the
short one cannot serve (nothing sent, stdin unread)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from krex_lab import paths
from krex_lab.cli import parse_run_args
from krex_lab.pytest_plugin import ArbiterProc, running_arbiter
from krex_lab.workers import wire
from krex_lab.workers.client import fast_run
from krex_lab.workers.endpoint import default_endpoint, ipc_path
from krex_lab.workers.results import JobResult
from tests import test_cli_exits
from tests.support import ROOT
from tests.support.pool import PoolProc, alive
from tests.workers.test_pool import SCRIPTS

#: the installed krex's entry; with KREX_PROBE_OUT set it writes there the modules it imported, which
#: tells whether the short way served (the full way imports zmq)
SHORT = [
    sys.executable,
    "-c",
    "import atexit, os, sys\n"
    "def dump():\n"
    "    if os.environ.get('KREX_PROBE_OUT'):\n"
    "        with open(os.environ['KREX_PROBE_OUT'], 'w') as f:\n"
    "            f.write(' '.join(sorted(sys.modules)))\n"
    "atexit.register(dump)\n"
    "from krex_lab.command import main\n"
    "main(sys.argv[1:])\n",
    "run",
]
FULL = [sys.executable, "-m", "krex_lab.cli", "run"]


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
        "--workers-per-gpu=1",
        "--spares=0",
        "--Pool.interrupt_grace=1.0",
        log=arb.runtime / "pool.log",
    )
    p.start()
    yield p
    p.stop()


@pytest.fixture
def env(pool: PoolProc) -> dict[str, str]:
    pool.wait_ready()
    return {**pool.env, "KREX_TEST_VAR": "from-the-caller"}


def run(
    cmd: list[str], env: dict[str, str], *args: str, stdin: bytes | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*cmd, *args],
        env=env,
        cwd=cwd,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )


#: writes, at exit, the modules the command imported (to the file named by the variable)
PROBE = (
    "import atexit, os, sys\n"
    "def dump():\n"
    "    with open(os.environ['KREX_PROBE_OUT'], 'w') as f:\n"
    "        f.write(' '.join(sorted(sys.modules)))\n"
    "atexit.register(dump)\n"
    "{entry}\n"
)


def installed_entry(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """What the installed ``krex`` runs, ``module:function`` (pyproject's ``[project.scripts]``; read
    without tomllib, which Python 3.10 lacks)."""
    found = re.search(r'^krex\s*=\s*"([\w.]+:\w+)"', pyproject.read_text(), re.M)
    assert found is not None, f"no krex console script in {pyproject}"
    return found.group(1)


def test_a_warm_run_imports_neither_zmq_nor_msgspec_nor_typing(env: dict[str, str], tmp_path: Path) -> None:
    module, func = installed_entry().split(":")
    (tmp_path / "empty.py").write_text("pass\n")
    out = tmp_path / "modules.json"
    entry = f"import sys\nfrom {module} import {func}\nsys.argv[1:] = ['run', {str(tmp_path / 'empty.py')!r}]\n{func}()"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(entry=entry)],
        env={**env, "KREX_PROBE_OUT": str(out)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    modules = out.read_text().split()
    heavy = ("zmq", "msgspec", "typing", "argparse", "re", "socket", "selectors", "krex_lab.protocol")
    assert [m for m in modules if m.split(".")[0] in heavy or m in heavy] == [], modules


def test_the_short_way_gives_what_the_full_way_gives(env: dict[str, str], tmp_path: Path) -> None:
    scripts = {
        **SCRIPTS,
        "stdin.py": "import sys\ndata = sys.stdin.read()\nprint(len(data), repr(data[:12]))\n",
        "unicode.py": "import sys\nprint('é ✓ \\x00 \"q\"', end='')\nsys.stderr.write('partial')\n",
        "lots.py": "for i in range(20000):\n    print(i, 'x' * 40)\n",
        "gpu.py": "import os\nprint(os.environ.get('CUDA_VISIBLE_DEVICES') is not None or True)\n",
    }
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
    cases: list[tuple[str, list[str], bytes | None]] = [
        (name, [str(tmp_path / name), "one", "--gpu", "7"], None) for name in scripts
    ]
    cases += [
        ("stdin.py", [str(tmp_path / "stdin.py")], b"piped \xc3\xa9 text\n" * 1000),
        ("gpu.py", ["--gpu", "1", "--quiet", str(tmp_path / "gpu.py")], None),
        ("gpu.py", ["--gpu=0", "--timeout", "30", str(tmp_path / "gpu.py")], None),
        ("ok.py", ["--timeout=0.5", str(tmp_path / "ok.py")], None),
    ]
    probe = tmp_path / "modules"
    for name, args, stdin in cases:
        short = run(SHORT, {**env, "KREX_PROBE_OUT": str(probe)}, *args, stdin=stdin, cwd=tmp_path)
        assert "zmq" not in probe.read_text().split(), f"{name}: the short way declined"
        full = run(FULL, env, *args, stdin=stdin, cwd=tmp_path)
        assert (short.returncode, short.stdout, short.stderr) == (full.returncode, full.stdout, full.stderr), name


def test_a_timeout_ends_the_script_as_the_full_way_says(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text("import time\nprint('start', flush=True)\ntime.sleep(30)\n")
    short = run(SHORT, env, "--timeout", "0.5", str(tmp_path / "slow.py"))
    full = run(FULL, env, "--timeout", "0.5", str(tmp_path / "slow.py"))
    assert short.returncode == full.returncode == 124, short.stderr
    assert short.stdout == full.stdout == b"start\n" and short.stderr == full.stderr


def test_ctrl_c_interrupts_the_script_as_the_full_way_does(pool: PoolProc, env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n")
    results = []
    for cmd in (SHORT, FULL):
        proc = subprocess.Popen(
            [*cmd, str(script)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"sleeping\n"
        worker = pool.status().running[0].pid
        time.sleep(0.3)  # into time.sleep (line 3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert worker is not None and alive(worker), "a first Ctrl-C interrupts the script, not its worker"
        results.append((proc.returncode, err))
        pool.wait_ready()
    assert results[0] == results[1]
    code, err = results[0]
    assert code == 130 and err.endswith(b"KeyboardInterrupt\n") and b'sleepy.py", line 3' in err, err


def test_a_second_ctrl_c_kills_a_script_that_ignores_the_first(
    pool: PoolProc, env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\n"
        "while True:\n    time.sleep(1)\n"
    )
    results = []
    for cmd in (SHORT, FULL):
        proc = subprocess.Popen(
            [*cmd, str(script)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None, "the first Ctrl-C was ignored by the script"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        results.append((proc.returncode, err.decode()))
        pool.wait_ready()
    assert results[0] == results[1], results
    assert results[0][0] == 128 + signal.SIGKILL, results


def test_a_client_killed_mid_run_ends_its_job(pool: PoolProc, env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "forever.py"
    script.write_text("import time\nprint('running', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([*SHORT, str(script)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"running\n"
    assert len(pool.status().running) == 1
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while pool.status().running:
        assert time.monotonic() < deadline, "the job of a killed krex run still runs"
        time.sleep(0.05)
    pool.wait_ready()


def test_a_gpu_the_pool_does_not_serve_goes_the_full_way(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("print('ran')\n")
    short = run(SHORT, env, "--gpu", "5", str(tmp_path / "ok.py"))
    full = run(FULL, env, "--gpu", "5", str(tmp_path / "ok.py"))
    assert short.returncode == full.returncode == 2 and short.stderr == full.stderr, short.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["s.py"],
        ["s.py", "a", "--gpu", "1"],
        ["--gpu", "1", "s.py", "-x", "--", "y"],
        ["--gpu=1", "--quiet", "s.py"],
        ["--timeout", "2.5", "--quiet", "--gpu", "0", "s.py", "--quiet"],
        ["--timeout=1e-3", "s.py"],
        ["-", "x"],
        ["--gpu", "0", "--gpu", "1", "s.py"],
    ],
)
def test_the_short_parser_reads_what_the_full_one_reads(argv: list[str]) -> None:
    mine = fast_run.parse(argv)
    theirs = parse_run_args(argv)
    assert mine is not None
    assert mine == {k: getattr(theirs, k) for k in ("gpu", "timeout", "quiet", "script", "args")}
    assert not theirs.exclusive


@pytest.mark.parametrize(
    "argv",
    [[], ["--exclusive", "s.py"], ["--help"], ["-h"], ["--gpu"], ["--gpu", "x", "s.py"], ["--gpu", "-1", "s.py"],
     ["--timeout", "0", "s.py"], ["--timeout", "inf", "s.py"], ["--timeout", "nan", "s.py"], ["--qu", "s.py"],
     ["--", "s.py"], ["--quiet=1", "s.py"], ["-1"]],
)  # fmt: skip
def test_the_short_parser_leaves_the_rest_to_the_full_one(argv: list[str]) -> None:
    assert fast_run.parse(argv) is None


def test_the_socket_is_found_where_the_pool_puts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KREX_POOL_ENDPOINT", "KREX_RUNTIME_DIR", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(var, raising=False)
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    for setting in ({"KREX_POOL_ENDPOINT": f"ipc://{tmp_path}/elsewhere.sock"}, {"KREX_RUNTIME_DIR": str(own)}):
        with monkeypatch.context() as mp:
            for k, v in setting.items():
                mp.setenv(k, v)
            want = ipc_path(default_endpoint())
            assert want is not None
            assert fast_run.socket_path() == want + fast_run.SUFFIX, setting
    # without XDG_RUNTIME_DIR: the same directory of /tmp as the full lookup (which creates one if none)
    found = paths._own_tmp_dirs()
    assert fast_run._own_tmp_dir() == (str(found[0]) if found else None)


# -- the one protocol: every name the short client writes or reads is a field of its struct ----------


def test_every_field_the_client_names_is_the_structs(tmp_path: Path) -> None:
    structs: dict[str, type[msgspec.Struct]] = {
        "PoolInfo": wire.PoolInfo,
        "FastRun": wire.FastRun,
        "JobSpec": wire.JobSpec,
        "FastInterrupt": wire.FastInterrupt,
        "Accepted": wire.Accepted,
        "Output": wire.Output,
        "FastResult": wire.FastResult,
        "FastError": wire.FastError,
        "JobResult": JobResult,
    }
    assert set(fast_run.FIELDS) == set(structs)
    for name, fields in fast_run.FIELDS.items():
        struct = structs[name]
        info = struct.__struct_config__
        known = {f.encode_name for f in msgspec.structs.fields(struct)} | {info.tag_field} - {None}
        assert set(fields) <= known, (name, set(fields) - known)


def test_what_the_client_sends_is_what_the_pool_reads(tmp_path: Path) -> None:
    """The frame the client builds decodes, strictly, as the pool's FastRun (stdin as bytes)."""
    job = {
        "kind": "script",
        "path": "/x.py",
        "argv": ["é", "\x00"],
        "cwd": "/",
        "env": {"A": "1"},
        "gpu": 1,
        "timeout": 2.5,
        "stdin": "aGk=",
    }
    frame = fast_run._frame({"op": "run", "job": job})
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    run = msgspec.json.decode(frame[4:], type=wire.FastRun)
    assert run.job.stdin == b"hi" and run.job.argv == ["é", "\x00"] and run.job.gpu == 1
    interrupt = msgspec.json.decode(fast_run._frame({"op": "interrupt", "force": True})[4:], type=wire.FastInterrupt)
    assert interrupt.force
    result = msgspec.json.encode(wire.FastResult(result=JobResult(ok=False, exit_code=3, error="e ✓")))
    decoded = fast_run._loads(result.decode())
    assert isinstance(decoded, dict) and decoded["result"] == {"ok": False, "exit_code": 3, "error": "e ✓"}
    with pytest.raises(UnicodeEncodeError):  # bytes that are no text go the full way (msgpack)
        fast_run._frame({"env": {"A": "\udcff"}})


# -- declining: a dead or foreign listener gets nothing ---------------------------------------------


class Listener:
    """A listener of this user at ``path`` that says ``hello`` first and records what it receives."""

    def __init__(self, path: Path, hello: bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.received = b""
        self.connections = 0
        self.hello = hello
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.sendall(self.hello)
                conn.settimeout(2)
                try:
                    while data := conn.recv(65536):
                        self.received += data
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize(
    "hello",
    [
        b"",  # says nothing and closes
        b"\x00\x00\x00\x05nope!",  # not JSON
        b"\xff\xff\xff\xff",  # a frame over the limit
        fast_run._frame({"pid": 1, "uid": 4242, "gpus": [0]}),  # another uid in its own words
        fast_run._frame({"pid": 1, "uid": os.geteuid(), "gpus": "all"}),  # not a pool's answer
    ],
)
def test_a_listener_that_is_no_pool_gets_nothing_and_the_run_goes_the_full_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hello: bytes
) -> None:
    (tmp_path / "s.py").write_text("print('ran')\n")
    monkeypatch.setenv("KREX_POOL_ENDPOINT", f"ipc://{tmp_path / 'pool.sock'}")
    listener = Listener(tmp_path / f"pool.sock{fast_run.SUFFIX}", hello)
    try:
        assert fast_run.run([str(tmp_path / "s.py")]) is None
        time.sleep(0.2)
        assert listener.connections == 1 and listener.received == b""
    finally:
        listener.close()


def test_a_dead_pools_socket_file_goes_the_full_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s.py").write_text("print('ran')\n")
    monkeypatch.setenv("KREX_POOL_ENDPOINT", f"ipc://{tmp_path / 'pool.sock'}")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / f"pool.sock{fast_run.SUFFIX}"))
    dead.close()  # the file stays, nobody listens
    assert fast_run.run([str(tmp_path / "s.py")]) is None
    monkeypatch.setenv("KREX_POOL_ENDPOINT", "tcp://127.0.0.1:9")
    assert fast_run.run([str(tmp_path / "s.py")]) is None


# -- a closed pipe, a pool without an arbiter ---------------------------------------------------------

pool_env = test_cli_exits.pool_env  # fixture: an on-demand pool of its own, no arbiter, no preload


def test_a_closed_pipe_ends_the_short_way_quietly(env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "big.py"
    script.write_text("for i in range(200000):\n    print(i)\n")
    for cmd in (SHORT, FULL):
        out = subprocess.run(
            f"{shlex.join([*cmd, str(script)])} | head -1; echo ${{PIPESTATUS[0]}}",
            shell=True,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            executable="/bin/bash",
        )
        assert out.stdout == "0\n141\n" and out.stderr == "", (cmd, out.stdout, out.stderr)


def test_without_an_arbiter_both_ways_say_so_alike(pool_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    started = run(FULL, pool_env, str(script))  # starts the pool (quietly: KREX_QUIET)
    assert started.returncode == 0 and started.stdout == b"ran\n", started.stderr
    loud = {k: v for k, v in pool_env.items() if k != "KREX_QUIET"}
    short, full = run(SHORT, loud, str(script)), run(FULL, loud, str(script))
    assert (short.returncode, short.stdout, short.stderr) == (full.returncode, full.stdout, full.stderr)
    assert short.stderr.decode().startswith("krex run: no KREX arbiter answers at "), short.stderr


def test_a_pool_that_dies_mid_run_ends_the_run_with_one_line(pool_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('running', flush=True)\ntime.sleep(60)\n")
    (tmp_path / "ok.py").write_text("pass\n")
    assert run(FULL, pool_env, str(tmp_path / "ok.py")).returncode == 0  # the pool is up, on demand
    probe = tmp_path / "modules"
    proc = subprocess.Popen(
        [*SHORT, str(script)],
        env={**pool_env, "KREX_PROBE_OUT": str(probe)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"running\n"
    runtime = Path(pool_env["KREX_RUNTIME_DIR"])
    pid = int((runtime / "pool.sock.lock").read_text().strip())
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=20)
    assert "zmq" not in probe.read_text().split()
    assert (proc.returncode, err.decode()) == (1, f"krex run: {fast_run.pool_died_line(pid)}\n")
