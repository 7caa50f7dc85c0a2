"""A measurement says what it measured.

A host callable (no GPU work) says that no GPU was timed, in a field and in every text; "converged"
means the noise criterion was met (a noise that settled above ``max_noise`` is "not converged
(noise X%)"); a framework that is not installed is one KREX error naming the package and the
install command, never a raw ModuleNotFoundError.
"""

from __future__ import annotations

import itertools
import sys
import time

import pytest

import krex_lab
from krex_lab import errors
from krex_lab.bench import stats
from krex_lab.bench.measurement import Measurement
from krex_lab.pytest_plugin import ArbiterProc

FAST = {"min_samples": 5, "min_time": 0.01, "timeout": 2.0, "warmup": 0.01, "max_noise": 0.5}


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def test_a_host_callable_says_no_gpu_was_timed() -> None:
    m = krex_lab.bench(busy, 0.1, exclusive=False, **FAST)
    assert m.gpu_timed is False and m.to_dict()["gpu_timed"] is False
    for text in (m.summary(), repr(m), m._repr_html_()):
        assert "no GPU was timed" in text, text
    assert any("no GPU was timed" in w for w in m.warnings), m.warnings


def test_a_host_callable_in_a_fake_backend_region_says_no_gpu_was_timed(arbiter: ArbiterProc) -> None:
    m = krex_lab.bench(busy, 0.1, **FAST)
    assert m.region is not None and m.region["simulated"] is True
    assert m.gpu_timed is False and "no GPU was timed" in m.summary()
    assert any("simulated" in w and "fake" in w for w in m.warnings), m.warnings


def test_settled_noise_above_max_noise_is_not_converged() -> None:
    # nvbench stops when the noise has settled; at 23 % against max_noise 0.5 % that is no convergence.
    cycle = itertools.cycle([0.7, 1.0, 1.3])  # rel. stdev about 22 %
    state = stats.Convergence(stats.Criterion(min_time=0.0))
    reason = None
    while reason is None:
        state.add(next(cycle))
        reason = state.stop_reason(0.0)
    assert reason == stats.STABLE
    m = Measurement.from_samples(
        "noisy", "host", "synthetic", state.samples, stop_reason=reason, criterion={"max_noise": 0.005}
    )
    assert not m.converged and m.to_dict()["converged"] is False
    assert "not converged (noise 2" in m.summary() and "converged (stable)" not in m.summary()
    assert "not converged (noise 2" in m._repr_html_()


def test_bench_of_a_noisy_callable_is_not_converged() -> None:
    durations = itertools.cycle([0.05, 0.1, 0.15])
    m = krex_lab.bench(lambda: busy(next(durations)), exclusive=False, **{**FAST, "max_noise": 0.01})
    assert m.rel_stdev > 0.1 and not m.converged
    assert "not converged (noise" in m.summary() and ", converged (" not in m.summary()
    assert any("max_noise" in w for w in m.warnings), m.warnings


def test_quiet_measurement_is_converged_and_says_so() -> None:
    m = Measurement.from_samples(
        "quiet", "host", "synthetic", [1.0, 1.001, 0.999] * 5, stop_reason="noise", criterion={"max_noise": 0.005}
    )
    assert m.converged and "converged (noise 0.0" in m.summary()


@pytest.mark.parametrize(("framework", "module"), [("torch", "torch"), ("cupy", "cupy"), ("numba", "numba")])
def test_a_framework_that_is_not_installed_is_one_krex_error(
    monkeypatch: pytest.MonkeyPatch, framework: str, module: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, f"{module}.cuda", raising=False)
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    with pytest.raises(errors.MissingDependency) as caught:
        krex_lab.bench(lambda: None, framework=framework, exclusive=False)
    err = caught.value
    assert isinstance(err, errors.KrexError) and isinstance(err, ImportError), "code catching ImportError still does"
    assert f"framework='{framework}'" in str(err) and "pip install" in str(err) and module in str(err)
    assert err.__cause__ is None or isinstance(err.__cause__, ImportError)
