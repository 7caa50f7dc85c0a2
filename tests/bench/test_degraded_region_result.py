"""A result timed in a degraded region says so, loudly, wherever it is shown: its repr, its
summary, its HTML and its JSON (what an agent reads)."""

from __future__ import annotations

import json

from krex_lab.bench.measurement import Measurement
from krex_lab.region_report import RegionReport


def _measured(region: RegionReport | None) -> Measurement:
    return Measurement.from_samples("k", "torch", "held", [1.0, 1.1, 0.9], region=region)


def _degraded() -> RegionReport:
    return RegionReport(
        region="r47",
        gpu=1,
        degraded=True,
        not_drained={"4242": "did not answer drain within 0.5 s"},
        failures=["not isolated in time"],
        frozen=[11, 12],
        drained=[13],
    )


def test_a_degraded_region_is_in_the_repr_the_summary_and_the_json() -> None:
    m = _measured(_degraded())
    for text in (repr(m), m.summary(), m._repr_html_()):
        assert "DEGRADED" in text, text
        assert "4242" in text and "did not answer drain" in text, text
    data = m.to_dict()
    assert data["degraded"] is True
    assert any("DEGRADED" in w and "not isolated in time" in w for w in data["warnings"]), data
    assert json.loads(json.dumps(data))["region"]["not_drained"] == {"4242": "did not answer drain within 0.5 s"}


def test_a_clean_region_and_no_region_say_nothing_of_it() -> None:
    for region in (RegionReport(region="r1", gpu=0, drained=[3]), None):
        m = _measured(region)
        assert "DEGRADED" not in repr(m) + m.summary() + m._repr_html_()
        assert m.to_dict()["degraded"] is False
