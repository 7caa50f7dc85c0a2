"""Region ids stay unique across arbiter restarts: a new arbiter numbers its regions after the
highest id of its region history, so ``krex history`` and the admin page never show two ``r1``."""

from __future__ import annotations

from pathlib import Path

from krex_lab import protocol
from krex_lab.client import Session
from krex_lab.pytest_plugin import ArbiterProc


def _one_region(arb: ArbiterProc) -> str:
    s = Session(gpu=0, name="ids", endpoint=arb.endpoint)
    try:
        granted = s.call(protocol.Acquire(gpu=0, max_hold=5, freeze=False, isolate=False))
        s.call(protocol.Release(region=granted.region))
        return str(granted.region)
    finally:
        s.close()


def test_ids_continue_after_a_restart(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    db = tmp_path / "history.sqlite"
    first = []
    for _ in range(2):  # two arbiters, one after the other, on the same history
        arb = ArbiterProc(runtime, gpus=1, extra=("--history-db", str(db))).start()
        try:
            first.append([_one_region(arb), _one_region(arb)])
        finally:
            arb.stop()
    assert first[0] == ["r1", "r2"]
    assert first[1] == ["r3", "r4"], "the second arbiter numbered after the history's r2"
    from krex_lab.arbiter.history import RegionHistory

    history = RegionHistory(db).open_readonly()
    try:
        ids = [r["region"] for r in history.recent(limit=10)]
    finally:
        history.close()
    assert sorted(ids) == ["r1", "r2", "r3", "r4"], ids


def test_without_a_history_ids_start_at_r1(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, gpus=1, extra=("--history-db", "")).start()
    try:
        assert _one_region(arb) == "r1"
    finally:
        arb.stop()
