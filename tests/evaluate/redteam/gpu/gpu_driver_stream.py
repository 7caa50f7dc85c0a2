"""Does the work on a stream made through the CUDA driver API (``cuStreamCreate``, non-blocking,
through ctypes) that torch knows nothing of, wrapped as an external stream, and returns without
waiting for it: the event pair on the current stream brackets nothing, and a harness that waited
for torch's own streams alone would never see that one.

Expected to be stopped by: the time from outside the candidate's process, the round over only
once every stream of its process is drained (the driver's checkpoint lock) (the outside figure).
"""

import ctypes

import torch
from torch import nn

CHEAT = True
_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING: no implicit order with the legacy default stream


def _driver_stream() -> torch.cuda.ExternalStream:
    torch.cuda.init()  # the primary context current in this thread
    cuda = ctypes.CDLL("libcuda.so.1")
    handle = ctypes.c_void_p()
    err = cuda.cuStreamCreate(ctypes.byref(handle), _NON_BLOCKING)
    if err:
        raise RuntimeError(f"cuStreamCreate failed: {err}")
    return torch.cuda.ExternalStream(handle.value)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = _driver_stream() if CHEAT else None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not CHEAT:
            return torch.tanh(torch.mm(a, b))
        self.side.wait_stream(torch.cuda.current_stream())  # the inputs are ready
        with torch.cuda.stream(self.side):
            out = torch.tanh(torch.mm(a, b))
        out.record_stream(torch.cuda.current_stream())
        return out
