"""Triton buffer-store workaround: recompile only the kernels whose buffer-store data a VALU
instruction overwrites too soon, with buffer ops off.

The scanner is :mod:`titan_rocm.scanner` (no torch, no triton); this package is the wrapper,
its bootstrap in compile workers, the cache tag and stats. Docs:
docs/triton-buffer-store-hazard.md.
"""
