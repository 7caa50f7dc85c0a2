"""Turns cuDNN's TF32 on for itself, as a submission may: then it does not compute in IEEE fp32."""

import torch
from reference import switches
from task import input_t, output_t


def custom_kernel(data: input_t) -> output_t:
    torch.backends.cudnn.allow_tf32 = True
    return switches()
