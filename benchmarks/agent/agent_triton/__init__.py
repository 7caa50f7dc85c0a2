"""Triton versions of three ``krex_lab.kernels`` kernels, the sources the agents of ``agent_study.py`` start from.

Each module is a template: ``agent_kernels.source`` applies a candidate's change to it and writes
it as a new file, whose ``run(*inputs, *outputs)`` takes the same arrays as the ``krex_lab.kernels``
candidate of that name (NumPy, numba device arrays or torch tensors) and checks against the same
reference. ``# @candidate@`` inside each ``@triton.jit`` body becomes the written file's name, so
that every written candidate is new code to Triton, as an agent's is (its cache keys on the
kernel's source). Imported only where Triton and a GPU are (``agent_kernels.space``).
"""
