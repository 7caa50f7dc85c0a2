"""Who a request comes from is what the kernel says, and what a user sees of another is a count
(issue "Hostile neighbours": forged identities, setuid helpers, snooping).

``bob`` and ``alice`` are real unprivileged users talking to a root ``krex arbiter --multi-user``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers_arbiter import (
    Agent,
    agents,
    assert_healthy,
    kill_tree,
    multi_user_arbiter,
    read_line,
    run_as,
    spawn_as,
)
from .users import User, make_user


@pytest.fixture
def alice() -> Iterator[User]:
    with make_user("krexalice") as user:
        yield user


REGISTER = r"""
conn = Connection(ENDPOINT)
info = conn.call(protocol.Hello(), timeout=5)
pid = int(ARGS[0])
ticket = ARGS[1] if len(ARGS) > 1 else fetch_ticket(info.identity)
try:
    conn.call(protocol.Register(pid=pid, ticket=ticket), timeout=5)
    out(registered=True)
except KrexError as exc:
    out(registered=False, error=err(exc))
"""


def test_forged_ticket_and_another_users_pid_are_refused(bob: User) -> None:
    with multi_user_arbiter() as arb:
        (forged,) = run_as(bob, arb, REGISTER, "1", "forged-ticket-" + "A" * 32)
        assert forged["error"]["type"] == "PermissionDenied"
        assert "no valid identity ticket" in forged["error"]["message"]
        (roots,) = run_as(bob, arb, REGISTER, str(os.getpid()))  # a real ticket of bob's, root's pid
        assert roots["error"]["type"] == "PermissionDenied" and "belongs to uid 0" in roots["error"]["message"]
        assert all(not g["sessions"] for g in arb.status()["gpus"])
        assert_healthy(arb, {bob.uid})


SETUID_SCRIPT = r"""
import json, os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
answer = s.makefile().readline().strip()
print(json.dumps({"ruid": os.getuid(), "euid": os.geteuid(), "pid": os.getpid(), "answer": answer}), flush=True)
sys.stdin.readline()  # stay alive: bob then tries to register this very process
"""


@pytest.fixture
def setuid_python() -> Iterator[Path]:
    """A setuid-root copy of the system's Python in a root-owned 0755 directory."""
    source = Path("/usr/bin/python3")
    if not source.exists():
        pytest.skip("no /usr/bin/python3 to copy")
    where = Path(tempfile.mkdtemp(prefix="krex-setuid-"))
    try:
        os.chmod(where, 0o755)
        exe = where / "python3"
        shutil.copy2(source.resolve(), exe)
        os.chown(exe, 0, 0)
        os.chmod(exe, 0o4755)
        yield exe
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_setuid_process_is_refused(bob: User, setuid_python: Path) -> None:
    with multi_user_arbiter() as arb:
        proc = subprocess.Popen(
            [str(setuid_python), "-I", "-c", SETUID_SCRIPT, str(arb.runtime / "identity.sock")],
            user=bob.uid,
            group=bob.gid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            try:
                seen = read_line(proc, timeout=20)
            except AssertionError as exc:
                pytest.skip(f"the setuid copy of Python does not run as {bob.name}: {exc}")
            if seen["euid"] != 0:
                pytest.skip("setuid is not honoured here (nosuid mount or no_new_privs)")
            assert seen["ruid"] == bob.uid
            # 1. the identity socket gives it no ticket
            assert seen["answer"].startswith("error") and "setuid" in seen["answer"], seen
            # 2. nor may bob register it with a ticket of his own
            (result,) = run_as(bob, arb, REGISTER, str(seen["pid"]))
            assert result["error"]["type"] == "PermissionDenied" and "setuid" in result["error"]["message"]
        finally:
            kill_tree(proc.pid)
            proc.wait(10)
        assert all(not g["sessions"] for g in arb.status()["gpus"])
        assert_healthy(arb, {bob.uid})


STATUS_VIEWS = r"""
conn = Connection(ENDPOINT)
info = conn.call(protocol.Hello(), timeout=5)
own = Session(gpu=1, endpoint=ENDPOINT, name="bob-own")
out(with_ticket=conn.call(protocol.Status(ticket=fetch_ticket(info.identity)), timeout=5),
    without_ticket=conn.call(protocol.Status(), timeout=5),
    regions=conn.call(protocol.Regions(ticket=fetch_ticket(info.identity)), timeout=5),
    own_session=own.id)
own.close()
"""

SUBSCRIBER = r"""
info = Connection(ENDPOINT).call(protocol.Hello(), timeout=5)
sub = zmq.Context().socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"krex.session")
sub.setsockopt(zmq.SUBSCRIBE, b"krex.region")
sub.connect(info.events)
time.sleep(0.3)  # the subscription reaches the PUB socket
out(ready=True)
events, until = [], None
while True:
    if select.select([sys.stdin], [], [], 0)[0] and until is None:
        sys.stdin.readline()
        until = time.monotonic() + 0.5
    if until is not None and time.monotonic() > until:
        break
    if sub.poll(50):
        topic, body = sub.recv_multipart()
        events.append({"topic": topic.decode(), "body": protocol.decode_event(body)})
out(events=events)
"""


def _ints(value: Any) -> set[int]:
    """Every integer anywhere in a decoded message."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, dict):
        return {i for k, v in value.items() for i in _ints(k) | _ints(v)}
    if isinstance(value, list):
        return {i for v in value for i in _ints(v)}
    return set()


@pytest.mark.parametrize("privacy", ["private", "open"])
def test_other_users_work_is_a_count_unless_open(bob: User, alice: User, privacy: str) -> None:
    with multi_user_arbiter(f"--Arbiter.privacy={privacy}") as arb, agents() as made:
        sub = spawn_as(bob, arb, SUBSCRIBER)
        try:
            assert read_line(sub)["ready"]
            a = Agent(alice, arb)
            made.append(a)
            assert a.call("register", tag="a", gpu=0, name="alice-secret-experiment")["ok"]
            a.call("acquire", tag="ra", session="a", opts={"gpu": 0, "max_hold": 60, "freeze": False})
            assert a.event("granted|acquire_failed", "ra")["event"] == "granted"
            (views,) = run_as(bob, arb, STATUS_VIEWS)
            assert a.call("release", tag="ra")["ok"]
            a.call("acquire", tag="rb", session="a", opts={"gpu": 0, "max_hold": 60, "freeze": False})
            assert a.event("granted|acquire_failed", "rb")["event"] == "granted"
            assert sub.stdin is not None
            sub.stdin.write(b"stop\n")
            sub.stdin.flush()
            events = read_line(sub, timeout=30)["events"]
        finally:
            kill_tree(sub.pid)
            sub.wait(10)
        topics = {e["topic"] for e in events}
        assert {"krex.session", "krex.region"} <= topics, topics
        seen_pids = set().union(*(_ints(e["body"]) for e in events))
        for view in ("with_ticket", "without_ticket"):
            gpu0 = views[view]["gpus"][0]
            holder = gpu0["holder"]
            assert holder is not None and holder["user"] == alice.name
            text = json.dumps(gpu0)
            if privacy == "private":
                assert "pid" not in holder and "name" not in holder, holder
                assert gpu0["sessions"] == [] and gpu0["other_sessions"] == {alice.name: 1}, gpu0
                assert "alice-secret-experiment" not in text and str(a.pid) not in text
            else:
                assert holder["pid"] == a.pid and holder["name"] == "alice-secret-experiment"
                assert [s["pid"] for s in gpu0["sessions"]] == [a.pid]
        # bob's own session is shown to him in full when he brings a ticket
        own = views["with_ticket"]["gpus"][1]
        assert [s["id"] for s in own["sessions"]] == [views["own_session"]]
        if privacy == "private":
            assert all("holder_pid" not in r and "name" not in r for r in views["regions"])
            assert a.pid not in seen_pids, "an event showed bob one of alice's pids"
            assert not any("alice-secret-experiment" in json.dumps(e) for e in events)
        else:
            assert a.pid in seen_pids
        print(f"privacy={privacy}: bob saw {len(events)} events; alice's pid among their numbers: {a.pid in seen_pids}")
        assert_healthy(arb, {bob.uid, alice.uid})


MULTI_USER_AS_BOB = r"""
try:
    krex_lab.cli.main(["arbiter", "--backend", "fake", "--multi-user", "--runtime-dir", "/tmp/krex-bob-" + ARGS[0]])
    code = 0
except SystemExit as exc:
    code = exc.code
out(code=code)
"""


def test_multi_user_arbiter_refuses_to_start_as_an_ordinary_user(bob: User) -> None:
    with multi_user_arbiter() as arb:  # only for the environment of bob's process
        (result,) = run_as(
            bob,
            arb,
            MULTI_USER_AS_BOB,
            str(time.monotonic_ns()),
            check=False,
            preimport="import krex_lab.cli, krex_lab.arbiter.app, krex_lab.arbiter.server, "
            "krex_lab.application, krex_lab.gpu.fake, krex_lab.gpu.traits, importlib.metadata, "
            "logging.handlers, shutil, "
            "argparse, gettext, textwrap, traitlets.config, traitlets.config.loader, "
            "pprint, glob, copy",
        )
    assert result["returncode"] == 0, result["stderr"]  # the wrapper itself ran to its end
    code = json.loads(result["stdout"].splitlines()[-1])["code"]
    assert code not in (0, None), result
    assert "needs root" in result["stderr"] + result["stdout"], result
    # the refusal came before any socket was made
    assert not any(Path("/tmp").glob("krex-bob-*/arbiter.sock"))
