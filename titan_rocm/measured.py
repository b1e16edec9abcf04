"""What titan-rocm's changes were measured to cost, with their stored results
(docs/performance.md); ``tests/unit/test_measured.py`` recomputes each from its logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

H200 = "one NVIDIA H200 (CUDA, not ROCm)"
"""No AMD GPU was available to the project."""


@dataclass(frozen=True)
class Measured:
    """One side-by-side throughput ratio from a stored benchmark result; with ``over``, ``figure``'s
    value over ``over``'s (the benchmark stores only the two runs' medians)."""

    key: str
    ratio: float
    what: str
    model: str
    gpu: str
    benchmark: str
    folder: str
    figure: tuple[str, ...]
    over: tuple[str, ...] = ()

    def sentence(self) -> str:
        """``0.9315 of stock tokens/s (deepseek_v3 3.9 B, one NVIDIA H200 ...; ...)``."""
        return (f"{self.ratio:g} x {self.what} tokens/s ({self.model}, {self.gpu}; "
                f"{self.benchmark}, {self.folder})")

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "over": self.what, "model": self.model, "gpu": self.gpu,
                "benchmark": self.benchmark, "folder": self.folder}


_GPU_VALIDATION = "benchmarks/gpu_validation.py"
_MOE_4B = "deepseek_v3 3.9 B MoE, GPU-bound"
_LLAMA_1B = "llama3 1.5 B dense, GPU-bound"

FIGURES: dict[str, Measured] = {m.key: m for m in (
    Measured("moe_eager_compile.block", 0.9315, "stock", _MOE_4B, H200, _GPU_VALIDATION,
             "benchmarks/results/2026-11-30-h200-d/tp-moe-scope",
             ("figures", "throughput", "deepseek_v3_4b", "tps_ratio_rocm_on_over_stock",
              "pooled")),
    Measured("moe_eager_compile.moe", 0.9656, "stock", _MOE_4B, H200, _GPU_VALIDATION,
             "benchmarks/results/2026-11-30-h200-d/tp-moe-scope",
             ("figures", "throughput", "deepseek_v3_4b",
              "tps_ratio_rocm_on_moe_scope_over_stock", "pooled")),
    Measured("moe_eager_compile.fp8", 0.5806, "stock", "deepseek_v3 debug FP8, host-bound",
             H200, _GPU_VALIDATION, "benchmarks/results/2026-11-30-h200-b/fp8",
             ("runs", "deepseek_v3_fp8_rocm", "tps_median"),
             ("runs", "deepseek_v3_fp8_stock", "tps_median")),
    Measured("divergence_guard.log_steps", 0.9974, "guard off", _LLAMA_1B, H200,
             _GPU_VALIDATION, "benchmarks/results/2026-11-30-h200-d/tp-guard",
             ("figures", "throughput", "llama3_1b_guard", "tps_ratio_guard_default_over_off",
              "pooled")),
    Measured("divergence_guard.every_step", 1.0028, "guard off", _LLAMA_1B, H200,
             _GPU_VALIDATION, "benchmarks/results/2026-11-30-h200-d/tp-guard",
             ("figures", "throughput", "llama3_1b_guard",
              "tps_ratio_guard_every_step_over_off", "pooled")),
    Measured("divergence_guard.every_step_exact", 0.9334, "guard off", _LLAMA_1B, H200,
             _GPU_VALIDATION, "benchmarks/results/2026-11-30-h200-d/tp-guard",
             ("figures", "throughput", "llama3_1b_guard",
              "tps_ratio_guard_every_step_exact_over_off", "pooled")),
    Measured("dense.all_on", 0.9995, "stock", _LLAMA_1B, H200, _GPU_VALIDATION,
             "benchmarks/results/2026-11-30-h200-b/throughput-llama3-1b",
             ("figures", "throughput", "llama3_1b", "tps_ratio_rocm_on_over_stock", "pooled")),
)}
"""``dense.all_on`` is every workaround forced on together on a dense model (none measured
alone there)."""

FP8_CONVERTERS = ("quantize.linear.float8", "quantize.grouped_mm.float8")
"""With MoE blocks eager, their casts run unfused."""


def cost_of(workaround: str, details: dict[str, Any], converters: list[str]) -> Measured | None:
    """The measured figure for ``workaround`` as decided (never from a default), or None."""
    if workaround == "moe_eager_compile":
        if any(c.strip() in FP8_CONVERTERS for c in converters):
            return FIGURES["moe_eager_compile.fp8"]
        return FIGURES.get(f"moe_eager_compile.{details.get('scope')}")
    if workaround == "divergence_guard":
        return FIGURES.get(f"divergence_guard.{details.get('check')}")
    return None
