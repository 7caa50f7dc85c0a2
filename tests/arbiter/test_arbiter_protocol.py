"""The arbiter never dies of a message; every request gets exactly one reply; users stay apart."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import krex_lab.client
from krex_lab import protocol
from krex_lab.connection import fetch_ticket
from krex_lab.errors import InvalidRequest, NotHolder, ProtocolError, UnknownSession
from krex_lab.pytest_plugin import ArbiterProc
from tests.security.users import make_user
from tests.support.procs import Procs

OPS = ["hello", "status", "place", "register", "unregister", "acquire", "release", "drain_ack", "regions"]
VALID = {
    "register": {"pid": 1, "ticket": "x", "role": "client", "name": "", "gpu": 0, "control": True},
    "acquire": {"session": "s", "token": "t", "gpu": 0, "max_hold": 1.0, "freeze": True, "isolate": True, "cores": 1},
    "release": {"session": "s", "token": "t", "region": "r1"},
    "regions": {"limit": 5},
}
INT64 = st.integers(-(2**63), 2**63 - 1)
junk = st.one_of(
    st.none(),
    st.booleans(),
    INT64,
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.lists(INT64, max_size=3),
    st.dictionaries(st.text(max_size=5), INT64, max_size=3),
)


def _garbage() -> st.SearchStrategy[bytes]:
    raw = st.binary(min_size=0, max_size=300)
    unknown_op = st.builds(
        lambda op, rid: protocol.encode({"v": protocol.VERSION, "id": rid, "op": op}),
        st.text(max_size=12).filter(lambda s: s not in OPS),
        st.integers(0, 2**31),
    )
    wrong_version = st.builds(
        lambda v, op: protocol.encode({"v": v, "id": 1, "op": op}),
        junk.filter(lambda v: v != protocol.VERSION or isinstance(v, bool)),
        st.sampled_from(OPS),
    )

    def wrong_type(op: str, field: str, value: object) -> bytes:
        body = {"v": protocol.VERSION, "id": 7, "op": op, **VALID[op]}
        body[field] = value
        return protocol.encode(body)

    wrong_types = st.sampled_from(sorted(VALID)).flatmap(
        lambda op: st.builds(
            wrong_type,
            st.just(op),
            st.sampled_from(sorted(VALID[op])),
            st.one_of(st.binary(max_size=4), st.lists(st.none(), max_size=2)),
        )
    )
    not_a_map = st.builds(protocol.encode, st.one_of(INT64, st.text(max_size=30), st.lists(junk, max_size=4)))
    missing = st.sampled_from(sorted(VALID)).map(lambda op: protocol.encode({"v": protocol.VERSION, "id": 3, "op": op}))
    return st.one_of(raw, unknown_op, wrong_version, wrong_types, not_a_map, missing)


def _invalid(data: bytes) -> bool:
    try:
        protocol.decode_request(data)
    except ProtocolError:
        return True
    return False


@pytest.fixture
def dealer(arbiter: ArbiterProc):  # type: ignore[no-untyped-def]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(arbiter.endpoint)
    yield sock
    sock.close()


def _one_reply(sock: zmq.Socket, frames: list[bytes], check_extra: bool = True) -> protocol.Reply:  # type: ignore[type-arg]
    sock.send_multipart(frames)
    assert sock.poll(5000), "the arbiter did not answer"
    reply = msgspec.msgpack.decode(sock.recv(), type=protocol.Reply)
    # A second reply would sit in the queue; the end of the run checks that none does.
    assert not check_extra or not sock.poll(50), "exactly one reply"
    return reply


def test_thousand_malformed_messages_each_get_an_error(arbiter: ArbiterProc, procs: Procs, dealer) -> None:  # type: ignore[no-untyped-def]
    sib = procs.start("sibling", "0", "--sleep")
    before = arbiter.status()
    count = 0

    @settings(max_examples=1100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_garbage().filter(_invalid))
    def check(data: bytes) -> None:
        nonlocal count
        reply = _one_reply(dealer, [data], check_extra=False)
        assert reply.ok is False and reply.error is not None
        assert reply.error.type == "ProtocolError" and reply.error.message
        count += 1

    check()
    assert not dealer.poll(200), "exactly one reply per message"
    # multi-frame messages get an error; an oversized one never reaches the decoder (the socket's
    # maximum message size drops it and disconnects the sender: nothing to answer)
    reply = _one_reply(dealer, [b"a", b"b", b"c"])
    assert not reply.ok and "one message frame" in reply.error.message  # type: ignore[union-attr]
    assert count >= 1000
    big = protocol.encode({"v": protocol.VERSION, "id": 99, "op": "status", "pad": "x" * (protocol.MAX_MESSAGE + 10)})
    dealer.send(big)
    assert not dealer.poll(300), "an oversized message is dropped unread"
    after = arbiter.status()
    assert arbiter.proc is not None and arbiter.proc.poll() is None
    assert [g["sessions"] for g in after["gpus"]] == [g["sessions"] for g in before["gpus"]]
    assert sib.pid in [s["pid"] for s in after["gpus"][0]["sessions"]]
    assert all(g["holder"] is None and not g["queue"] for g in after["gpus"])


def test_rejections_are_typed_and_readable(arbiter: ArbiterProc) -> None:
    session = krex_lab.client.attach(gpu=0)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        session.call(protocol.Register(pid=1, ticket="t", name="x" * protocol.MAX_MESSAGE))
    with pytest.raises(InvalidRequest, match="GPU 5 does not exist"):
        session.call(protocol.Acquire(gpu=5))
    with pytest.raises(InvalidRequest, match="max_hold"):
        session.call(protocol.Acquire(max_hold=-1.0))
    with pytest.raises(UnknownSession, match="attach again"):
        session.connection().call(protocol.Acquire(session=session.id, token="wrong"))
    with pytest.raises(NotHolder):
        session.call(protocol.Release(region="r999"))


def test_cannot_release_a_region_it_does_not_hold(arbiter: ArbiterProc, procs: Procs) -> None:
    holder = procs.start("holder", "1", wait_line="granted")
    region = arbiter.status()["gpus"][1]["holder"]["region"]
    other = krex_lab.client.attach(gpu=0)
    with pytest.raises(NotHolder, match="another session"):
        other.call(protocol.Release(region=region))
    assert arbiter.status()["gpus"][1]["holder"]["pid"] == holder.pid


def _as_user(uid: int, gid: int, endpoint: str, forge: bool, pid: int, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    # A forked child that drops to another user: the same code, a different owner.
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        zmq.Context.instance()  # a fresh context in this process
        conn = krex_lab.client.Connection(endpoint)
        info = conn.call(protocol.Hello(), timeout=5)
        ticket = "made-up-ticket" if forge else fetch_ticket(info.identity)
        conn.call(protocol.Register(pid=pid, ticket=ticket), timeout=5)
        queue.put("registered")
    except Exception as exc:
        queue.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_cannot_register_another_users_process() -> None:
    with make_user("krexproto") as user:  # removed after, with what it left in /tmp
        _register_as(user.uid, user.gid)


def _register_as(uid: int, gid: int) -> None:
    # pytest's tmp_path lives under a 0700 directory; a multi-user arbiter's must be reachable.
    runtime = Path(tempfile.mkdtemp(prefix="krex-multi-user-"))
    os.chmod(runtime, 0o755)
    arb = ArbiterProc(runtime, extra=("--multi-user",)).start()
    try:
        ctx = multiprocessing.get_context("fork")
        results = []
        for forge in (False, True):  # a real ticket naming a root pid, then a forged ticket
            q = ctx.Queue()
            p = ctx.Process(target=_as_user, args=(uid, gid, arb.endpoint, forge, os.getpid(), q))
            p.start()
            results.append(q.get(timeout=20))
            p.join(10)
        assert results[0].startswith("PermissionDenied") and "belongs to uid 0" in results[0]
        assert results[1].startswith("PermissionDenied") and "no valid identity ticket" in results[1]
        assert all(not g["sessions"] for g in arb.status()["gpus"])
    finally:
        arb.stop()
        shutil.rmtree(runtime, ignore_errors=True)
        arb.log_path.unlink(missing_ok=True)


def test_an_old_client_hears_about_the_protocol_version(arbiter: ArbiterProc, dealer) -> None:  # type: ignore[no-untyped-def]
    # What a protocol-1 client sends: a plain map with v=1. It gets a readable error, not silence.
    reply = _one_reply(dealer, [protocol.encode({"v": 1, "id": 41, "op": "hello"})])
    assert not reply.ok and reply.id == 41 and reply.error is not None
    assert reply.error.type == "ProtocolError"
    assert f"protocol version 1 is not supported: this arbiter speaks version {protocol.VERSION}" in reply.error.message


def test_deep_nesting_gets_an_error_reply(arbiter: ArbiterProc, dealer) -> None:  # type: ignore[no-untyped-def]
    nested = b"\x81\xa1a" * 20000 + b"\x01"  # {"a": {"a": ... 1}}: 60 KB, 20000 levels
    reply = _one_reply(dealer, [nested])
    assert not reply.ok and reply.error is not None and "nested too deeply" in reply.error.message
    assert arbiter.status()["gpus"]


def test_an_acquire_carries_exactly_a_region_spec() -> None:
    """The wire's acquire has RegionSpec's fields, with its types and defaults: the spec a client
    builds reaches the arbiter as it is, and back (a field added to one is added to the other)."""
    spec_fields = {f.name: (f.type, f.default) for f in msgspec.inspect.type_info(protocol.RegionSpec).fields}
    acquire = {f.name: (f.type, f.default) for f in msgspec.inspect.type_info(protocol.Acquire).fields}
    assert {k: acquire[k] for k in spec_fields if k in acquire} == spec_fields
    assert set(acquire) - set(spec_fields) == {"v", "id", "session", "token"}
    spec = protocol.RegionSpec(gpu=1, max_hold=2.5, freeze=False, isolate=True, cores=3, exempt=[7])
    request = protocol.Acquire.asking(spec, session="s1", token="t")
    assert protocol.decode_request(protocol.encode(request)).spec == spec
