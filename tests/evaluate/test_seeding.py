"""The judge seeds the inputs it draws as ``torch.manual_seed`` would, without formatting its
caller's stack for every backend that is not running (CUDA on a host without one, XPU, MTIA):
done for each input set, that took a third of a CPU evaluation."""

from __future__ import annotations

import traceback

import pytest

from krex_lab.evaluate.judge.tensors import seed_torch

torch = pytest.importorskip("torch")


def test_the_same_inputs_as_manual_seed() -> None:
    torch.manual_seed(1234)
    expected = torch.randn(64), torch.rand(3, 5), torch.randint(0, 100, (7,))
    seed_torch(1234)
    got = torch.randn(64), torch.rand(3, 5), torch.randint(0, 100, (7,))
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host CUDA's seed waits for it to start")
def test_seeding_formats_no_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = traceback.format_stack
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: calls.append(1) or real(*a, **k))
    for seed in range(20):
        seed_torch(seed)
    assert calls == []
