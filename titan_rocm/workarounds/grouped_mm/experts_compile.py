"""Compile the bound experts function where stock TorchTitan compiles its own.

Stock ``apply_compile`` leaves the bound function alone, so without this the experts would
run eager (2.85 % slower on a GPU-bound deepseek_v3 on an H200, docs/performance.md)."""

from __future__ import annotations

import dataclasses

import torch

from titan_rocm.log import log
from titan_rocm.workarounds.base import Context
from titan_rocm.workarounds.grouped_mm.backends import ExpertsFn, is_compilable


@dataclasses.dataclass(frozen=True)
class CompileRequest:
    """How TorchTitan compiles this job's model, as far as the experts function cares."""

    enabled: bool
    """TorchTitan compiles the model (``[compile] enable`` and ``"model"`` in components)."""
    backend: str = "inductor"
    """``[compile] backend``."""
    ep_enabled: bool = False
    """Expert parallelism: token counts per rank vary, so the token dimension is dynamic."""
    moe_eager: bool = False
    """The job runs ``rocm.moe_eager_compile``: every MoE module, experts included, is eager."""
    moe_eager_scope: str = "block"
    """Its ``[rocm] moe_eager_scope``: the whole MoE block eager, or only the MoE module."""

    @classmethod
    def from_context(cls, ctx: Context) -> CompileRequest:
        """From the job's compile settings, EP degree and decisions."""
        return cls(
            enabled=ctx.compile.model,
            backend=ctx.compile.backend or "inductor",
            ep_enabled=ctx.parallel.ep_enabled,
            moe_eager=ctx.will_apply("moe_eager_compile"),
            moe_eager_scope=ctx.settings.moe_eager_scope,
        )


NOT_COMPILED = CompileRequest(enabled=False)


def static_reason(backend: str, request: CompileRequest) -> str | None:
    """Why the experts function stays eager, or None when it runs compiled."""
    if not request.enabled:
        return "TorchTitan does not compile the model"
    if not is_compilable(backend):
        return (
            f"backend {backend!r} is not traceable with fullgraph (a registered backend opts "
            "in with register_backend(..., compilable=True))"
        )
    if request.moe_eager:
        if request.moe_eager_scope == "moe":
            return (
                "rocm.moe_eager_compile keeps each MoE module eager, experts included "
                "(moe_eager_scope = \"moe\": only attention and norms of MoE blocks compile)"
            )
        return "rocm.moe_eager_compile keeps the MoE blocks eager, experts included"
    return None


class ExpertsRunner:
    """Calls one backend, eager or compiled as decided at the first call."""

    def __init__(self, backend: str, fn: ExpertsFn, request: CompileRequest) -> None:
        self.backend = backend
        self.fn = fn
        self.request = request
        self.compiled: bool | None = None
        """None until the first call; then whether the backend runs compiled."""
        self.why = "not called yet"
        self._run: ExpertsFn | None = None

    def decide(self) -> tuple[bool, str]:
        """Whether to compile, and why."""
        reason = static_reason(self.backend, self.request)
        if reason is not None:
            return False, reason
        return True, (
            f"compiled with fullgraph (backend {self.request.backend!r}), as stock "
            "apply_compile compiles TorchTitan's own"
        )

    def _first_call(self) -> ExpertsFn:
        self.compiled, self.why = self.decide()
        run = self.fn
        if self.compiled:
            compiled = torch.compile(self.fn, backend=self.request.backend, fullgraph=True)
            if self.request.ep_enabled:
                def run(w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, x: torch.Tensor,
                        num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
                    # As stock: the number of tokens an EP rank receives varies per step.
                    torch._dynamo.mark_dynamic(x, 0)
                    return compiled(w1, w2, w3, x, num_tokens_per_expert)
            else:
                run = compiled
        log.info(
            "titan-rocm: grouped-MM experts function (backend %r) runs %s: %s",
            self.backend, "compiled" if self.compiled else "eager", self.why,
        )
        return run

    def __call__(self, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, x: torch.Tensor,
                 num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        if self._run is None:
            self._run = self._first_call()
        return self._run(w1, w2, w3, x, num_tokens_per_expert)
