"""A degraded region's log line names a few processes and a count, not every one of them."""

from __future__ import annotations

import logging
import time

import pytest

from krex_lab.arbiter.records import DEGRADED_EVERY, RegionRecords, brief
from krex_lab.region_report import RegionReport


def test_sixty_three_processes_not_drained_are_one_short_reason() -> None:
    why = "not KREX-aware (no control channel) and not lockable"
    report = RegionReport(region="r1", degraded=True, not_drained={str(1000 + i): why for i in range(63)})
    lines = brief(report)
    assert lines == [f"63 processes (1000, 1001, 1002 and 60 more) not drained: {why}"]
    # the report itself still names every one of them
    assert len(report.why_degraded()) == 63


def test_failures_are_cut_after_a_few_and_one_reason_is_named_whole() -> None:
    report = RegionReport(
        region="r2",
        degraded=True,
        not_drained={"7": "did not answer drain within 1.00 s"},
        failures=[f"pid {i}: Operation not permitted" for i in range(10)],
    )
    assert brief(report) == [
        "process 7 not drained: did not answer drain within 1.00 s",
        "pid 0: Operation not permitted",
        "pid 1: Operation not permitted",
        "pid 2: Operation not permitted",
        "7 more failures",
    ]
    assert brief(RegionReport(region="r3")) == []


def test_a_users_degraded_regions_make_one_line_a_second(caplog: pytest.LogCaptureFixture) -> None:
    records = RegionRecords("", retention_days=1, arbiter="a", per_user=10, metrics=False, live=lambda: None)  # type: ignore[arg-type,return-value]
    why = {"9": "did not answer drain within 1.00 s"}
    with caplog.at_level(logging.WARNING, logger="krex.arbiter"):
        for i in range(50):
            records.region_finished(RegionReport(region=f"r{i}", user="alice", degraded=True, not_drained=why))
        records.region_finished(RegionReport(region="b1", user="bob", degraded=True, not_drained=why))
        lines = [r.getMessage() for r in caplog.records]
        assert [line.split(" was")[0] for line in lines] == [
            "region r0 of alice on GPU -1",
            "region b1 of bob on GPU -1",
        ]
        time.sleep(DEGRADED_EVERY)
        records.region_finished(RegionReport(region="r50", user="alice", degraded=True, not_drained=why))
    assert "(49 more of alice's regions degraded since the last such line)" in caplog.records[-1].getMessage()
