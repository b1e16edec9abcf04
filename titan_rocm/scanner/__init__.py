"""The AMDGCN parser, hazard rules and cache scanner behind ``titan-rocm scan`` and
``rocm.triton_war`` (no torch, no Triton)."""
