"""Computes in place in its input and returns the input: values right, input destroyed."""


def custom_kernel(data):
    x, _ = data
    x.mul_(2.0).add_(1.0)
    return x
