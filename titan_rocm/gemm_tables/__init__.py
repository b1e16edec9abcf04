"""aiter tuned GEMM tables: make them safe for HIP-graph capture (``titan-rocm gemm-tables``).

Torch-free: only the standard library and :mod:`titan_rocm.archs`. Docs: docs/gemm-tables.md.
"""

from titan_rocm.gemm_tables.capture_safe import CaptureSafeError, Result, capture_safe
from titan_rocm.gemm_tables.policy import POLICIES

__all__ = ["POLICIES", "CaptureSafeError", "Result", "capture_safe"]
