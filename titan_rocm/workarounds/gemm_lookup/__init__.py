"""``rocm.gemm_lookup``: GEMM kernels ``titan-rocm tune`` validated (docs/validated-tuning.md)."""
