"""Triton buffer-store workaround: find AMDGCN buffer stores whose data registers a VALU
instruction overwrites too soon, and recompile only those kernels with buffer ops off.

Scanner modules: ``amdgcn`` (a small AMDGCN text parser), ``hazards`` (the hazard rules),
``scan`` (the public scanning API used by the compile wrapper and ``titan-rocm scan``).
The compile wrapper's modules sit beside them.
Docs: docs/triton-buffer-store-hazard.md.
"""
