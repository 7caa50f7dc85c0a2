import torch


def custom_kernel(data):
    return torch.amin(data, dim=0), torch.amin(data, dim=0)  # the minimum twice
