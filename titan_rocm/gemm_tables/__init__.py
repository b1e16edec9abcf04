"""aiter tuned GEMM tables: make them safe for HIP-graph capture (``titan-rocm gemm-tables``).

Torch-free: only the standard library, :mod:`titan_rocm.archs` and :mod:`titan_rocm.platform`.
The capture hazards are named rules (:data:`rules.RULES`). Docs: docs/gemm-tables.md.
"""

from titan_rocm.gemm_tables.capture_safe import CaptureSafeError, Result, capture_safe
from titan_rocm.gemm_tables.policy import POLICIES
from titan_rocm.gemm_tables.rules import RULES

__all__ = ["POLICIES", "RULES", "CaptureSafeError", "Result", "capture_safe"]
