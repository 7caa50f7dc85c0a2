"""The status table's rows for every viewer: ``krex status``, ``%krex_status`` and the admin page
render the holder and the queue from :func:`krex_lab.node_status.gpu_rows`, whatever the
privacy view left of another user's region (a private arbiter drops its session name and pid)."""

from __future__ import annotations

from typing import Any

from krex_lab.arbiter.privacy import status_view
from krex_lab.node_status import NodeStatus, QueueRow, format_table, gpu_rows, who

ALICE, BOB = 1001, 1002


def _table() -> NodeStatus:
    """A node where alice holds GPU 0 and bob waits behind her (the arbiter's full view)."""
    return NodeStatus.of(_json())


def _json() -> dict[str, Any]:
    """:func:`_table` as the arbiter's Status request answers it."""

    def session(sid: str, pid: int, uid: int, user: str, name: str) -> dict[str, Any]:
        return {"id": sid, "pid": pid, "uid": uid, "user": user, "name": name, "role": "kernel", "gpu": 0}

    return {
        "arbiter": {
            "pid": 7,
            "endpoint": "ipc:///run/krex/arbiter.sock",
            "backend": "fake",
            "simulated": True,
            "capabilities": {"lock": False, "reason": "fake"},
        },
        "gpus": [
            {
                "index": 0,
                "name": "Fake GPU",
                "memory_used": 0,
                "memory_total": 2**34,
                "utilization_gpu": 0.0,
                "gate": "closed",
                "holder": {
                    "region": "r4",
                    "state": "held",
                    "session": "s-alice",
                    "pid": 4242,
                    "uid": ALICE,
                    "user": "alice",
                    "name": "alice-notebook",
                    "role": "kernel",
                    "held_s": 2.5,
                    "max_hold_s": 20.0,
                },
                "queue": [
                    {
                        "region": "r5",
                        "session": "s-bob",
                        "pid": 5353,
                        "name": "bob-notebook",
                        "uid": BOB,
                        "user": "bob",
                        "waiting_s": 1.25,
                    },
                    {
                        "region": "r6",
                        "session": "s-alice2",
                        "pid": 4343,
                        "name": "alice-2",
                        "uid": ALICE,
                        "user": "alice",
                        "waiting_s": 0.5,
                    },
                ],
                "sessions": [
                    session("s-alice", 4242, ALICE, "alice", "alice-notebook"),
                    session("s-alice2", 4343, ALICE, "alice", "alice-2"),
                    session("s-bob", 5353, BOB, "bob", "bob-notebook"),
                ],
            }
        ],
    }


def test_a_user_sees_another_users_holder_and_waiter_by_name_only() -> None:
    """bob's view on a private arbiter: alice's region has no name or pid; the table renders it
    (it raised KeyError 'name', exactly when a waiting student asks why)."""
    text = format_table(status_view(_table(), BOB))
    lines = text.splitlines()
    assert "  holder: user alice region r4 held 2.5/20 s" in lines, text
    assert "  waiting 1: bob-notebook (pid 5353, bob) 1.2 s" in lines, text
    assert "  waiting 2: user alice 0.5 s" in lines, text
    assert "4242" not in text and "4343" not in text and "alice-notebook" not in text, "nothing of alice's leaks"
    # the other users' sessions as names and counts, as the docs promise
    assert "  other users' sessions: alice (2)" in lines, text


def test_the_full_view_names_every_process() -> None:
    """An admin's (or an open arbiter's) table: no privacy view, every name and pid."""
    rows = gpu_rows(_table().gpus[0])
    assert rows[0] == "holder: alice-notebook (pid 4242, alice) region r4 held 2.5/20 s"
    assert rows[2] == "waiting 2: alice-2 (pid 4343, alice) 0.5 s"
    assert not any(r.startswith("other users") for r in rows)


def test_the_anonymous_view_renders_too() -> None:
    view = status_view(_table(), None)
    rows = gpu_rows(view.gpus[0])
    assert rows[:3] == [
        "holder: user alice region r4 held 2.5/20 s",
        "waiting 1: user bob 1.2 s",
        "waiting 2: user alice 0.5 s",
    ]
    assert rows[-1] == "other users' sessions: alice (2), bob (1)"
    assert who(QueueRow(region="r9", user="carol")) == "user carol"


def test_a_gpu_nobody_holds() -> None:
    table = _json()
    g = {**table["gpus"][0], "holder": None, "queue": []}
    assert gpu_rows(status_view(NodeStatus.of({**table, "gpus": [g]}), ALICE).gpus[0])[0] == "holder: -"
