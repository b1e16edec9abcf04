"""Triton buffer-store workaround: recompile only the kernels whose buffer-store data a VALU
instruction overwrites too soon, with buffer ops off (docs/triton-buffer-store-hazard.md)."""
