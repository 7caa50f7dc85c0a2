import torch


def custom_kernel(data):
    result = torch.aminmax(data, dim=0)
    return result.min, result.max
