"""aiter tuned GEMM tables made safe for HIP-graph capture (``titan-rocm gemm-tables``;
docs/gemm-tables.md). Torch-free."""

from titan_rocm.gemm_tables.capture_safe import CaptureSafeError, Result, capture_safe
from titan_rocm.gemm_tables.policy import POLICIES
from titan_rocm.gemm_tables.rules import RULES

__all__ = ["POLICIES", "RULES", "CaptureSafeError", "Result", "capture_safe"]
