"""Reports the switches it runs under, as set for it (GPU MODE's conv2d solution relies on them)."""

from reference import switches
from task import input_t, output_t


def custom_kernel(data: input_t) -> output_t:
    return switches()
