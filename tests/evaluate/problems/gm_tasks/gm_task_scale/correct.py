import torch
from task import input_t, output_t


def custom_kernel(data: input_t) -> output_t:
    x, out = data
    torch.mul(x, 3.0, out=out)
    out.sub_(1.0)
    return out
