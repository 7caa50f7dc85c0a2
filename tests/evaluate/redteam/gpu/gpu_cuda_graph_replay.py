"""CUDA-graph replay: captures the computation once, on the first inputs it meets, and replays
that graph on every later call without copying the new inputs into the captured ones. The graph
reads the first call's memory and writes one static output buffer that every call returns.

Expected to be stopped by: fresh inputs each trial and each round, the refilled-buffer trial and
the re-check of timed outputs (the data path); outputs in the judge's buffers (one static buffer
returned by every call is caught as aliasing across calls) (the data path).
"""

import torch
from torch import nn

CHEAT = True


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.graph = None
        self.static_out = None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not CHEAT:
            return torch.tanh(torch.mm(a, b))
        if self.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the capture, as CUDA graphs ask
                torch.tanh(torch.mm(a, b))
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_out = torch.tanh(torch.mm(a, b))
        self.graph.replay()
        return self.static_out
