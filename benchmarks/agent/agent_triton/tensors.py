"""What the Triton candidates share: torch views of their arguments, and the copy back to NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def on_gpu(x: Any) -> Any:
    """A CUDA tensor of ``x``: NumPy arrays are copied, device arrays (numba, CuPy: their
    ``__cuda_array_interface__``) and tensors are viewed as they are."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x).cuda()
    if isinstance(x, torch.Tensor):
        return x
    return torch.as_tensor(x, device="cuda")


def to_host(tensor: Any, host: Any) -> None:
    """Copy a result into ``host`` when the caller passed a NumPy array."""
    if isinstance(host, np.ndarray):
        host[...] = tensor.cpu().numpy()
