"""Triton buffer-store workaround: find AMDGCN buffer stores whose data registers a VALU
instruction overwrites too soon, and recompile only those kernels with buffer ops off.

Scanner (no torch, no triton): ``amdgcn`` (a small AMDGCN text parser), ``hazards`` (the
hazard rules), ``scan`` (the public scanning API used by the compile wrapper and
``titan-rocm scan``).

Wrapper: ``compile_hook`` (wraps ``triton.compile``, recompiles hazardous kernels with buffer
ops off under a process-wide lock), ``bootstrap`` + ``_boot/sitecustomize.py`` (the same
wrapper in Inductor's compile workers), ``cache_tag`` (keeps Inductor's FX graph cache from
serving unscanned binaries), ``stats`` (per-process counts, merged across workers),
``workaround`` (the ``rocm.triton_war`` converter step).

Docs: docs/triton-buffer-store-hazard.md.
"""
