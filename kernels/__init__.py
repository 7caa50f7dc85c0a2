"""Candidate GPU kernels (numba.cuda) with references, input makers and size presets."""
