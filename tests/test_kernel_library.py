"""The candidate library (``krex_lab.kernels``) under numba's CUDA simulator: every candidate matches its NumPy
reference at small, awkward sizes; presets are estimated near their names on an H200."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from .numba_sim import use_simulator

KERNELS = ["vector_add", "reduction", "softmax", "transpose", "matmul"]
CANDIDATES = ["naive", "optimised"]
TARGETS = {"0.05ms": 0.05, "0.1ms": 0.1, "1ms": 1.0, "10ms": 10.0}


@pytest.fixture(scope="module")
def lib() -> Any:
    use_simulator()
    from krex_lab import kernels
    from krex_lab.kernels import spec

    assert spec.SIMULATOR, "the simulator, not a GPU"
    return kernels


def test_registry(lib: Any) -> None:
    assert list(lib.REGISTRY) == KERNELS
    for name in KERNELS:
        s = lib.get(name)
        assert set(s.candidates) == set(CANDIDATES) and set(s.presets) == set(TARGETS) == set(lib.PRESETS)
        assert s.test_sizes and s.summary
    with pytest.raises(KeyError, match="the library has vector_add"):
        lib.get("fft")


@pytest.mark.parametrize("candidate", CANDIDATES)
@pytest.mark.parametrize("name", KERNELS)
def test_candidate_matches_reference(lib: Any, name: str, candidate: str) -> None:
    spec = lib.get(name)
    for size in spec.test_sizes:
        result = spec.check(candidate, size)
        assert result.ok, result.message()


def test_candidates_take_device_arrays_too(lib: Any) -> None:
    from numba import cuda

    import krex_lab

    spec = lib.get("softmax")
    rng = np.random.default_rng(5)

    def device_case(rng: np.random.Generator) -> Any:
        ins, outs = spec.make_inputs(rng, spec.test_sizes[0])
        return tuple(cuda.to_device(x) for x in ins), tuple(cuda.to_device(x) for x in outs)

    krex_lab.check(spec.candidates["optimised"], spec.reference, device_case, rtol=spec.rtol, atol=spec.atol)
    ins, outs = spec.device_inputs({"rows": 3, "cols": 40}, seed=1)
    x = ins[0].copy_to_host()
    assert x.shape == (3, 40) and x.dtype == np.float32 and len(np.unique(x)) > 100
    assert (x >= spec.low).all() and (x < spec.high).all()
    assert outs[0].shape == (3, 40)
    assert rng is not None


def test_presets_are_estimated_near_their_names(lib: Any) -> None:
    for name in KERNELS:
        spec = lib.get(name)
        for preset, target in TARGETS.items():
            est = spec.estimate_ms(preset)
            assert abs(est / target - 1) < 0.1, f"{name} {preset}: estimated {est:.4f} ms"
        sizes = [spec.work(**spec.presets[p]).bytes for p in TARGETS]
        assert sizes == sorted(sizes) and sizes[-1] < 48e9, "the 10 ms preset fits an H200 with room to spare"


def test_import_kernels_is_cheap() -> None:
    """``import krex_lab`` leaves the library alone; importing the library loads neither numba nor NumPy."""
    code = (
        "import sys, krex_lab\n"
        "assert 'krex_lab.kernels' not in sys.modules, 'import krex_lab imported the library'\n"
        "from krex_lab import kernels\n"
        "assert 'numba' not in sys.modules and 'numpy' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
