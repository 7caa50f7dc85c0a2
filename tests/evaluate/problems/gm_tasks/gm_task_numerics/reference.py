"""The switches a program computes under, as numbers: cuDNN's TF32, cuBLAS's TF32, and whether
float32 matmuls are at their highest precision. GPU MODE decides on IEEE fp32: (0, 0, 1)."""

import torch
from task import input_t, output_t

IEEE = (0.0, 0.0, 1.0)


def switches() -> torch.Tensor:
    return torch.tensor(
        [
            float(torch.backends.cudnn.allow_tf32),
            float(torch.backends.cuda.matmul.allow_tf32),
            float(torch.get_float32_matmul_precision() == "highest"),
        ]
    )


def ref_kernel(data: input_t) -> output_t:
    return switches()


def generate_input(size: int, seed: int) -> input_t:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(size, generator=g),)


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    judge = tuple(ref_kernel(data).tolist())
    if judge != IEEE:
        return False, f"the reference's check ran under {judge}, not IEEE fp32 {IEEE}"
    got = tuple(output.tolist())
    if got != IEEE:
        return False, f"the submission ran under {got}, not IEEE fp32 {IEEE}"
    return True, ""
