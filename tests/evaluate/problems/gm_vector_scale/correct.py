import torch


def custom_kernel(data):
    x, out = data
    torch.mul(x, 2.0, out=out)
    out.add_(1.0)
    return out
