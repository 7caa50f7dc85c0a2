"""A degraded region's log line names a few processes and a count, not every one of them."""

from __future__ import annotations

from krex_lab.arbiter.records import brief
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
        "process (7) not drained: did not answer drain within 1.00 s",
        "pid 0: Operation not permitted",
        "pid 1: Operation not permitted",
        "pid 2: Operation not permitted",
        "7 more failures",
    ]
    assert brief(RegionReport(region="r3")) == []
