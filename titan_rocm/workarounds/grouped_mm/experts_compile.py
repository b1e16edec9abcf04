"""Compile the bound experts function where stock TorchTitan compiles its own.

Stock llama4 ``apply_compile`` wraps ``_run_experts_grouped_mm`` in
``torch.compile(fullgraph=True)`` (and, under expert parallelism, marks the token dimension
dynamic before each call). titan-rocm's bound function carries the name that makes stock
leave it alone, because ``loop``'s host sync cannot be traced. Without this module the
experts' SwiGLU would then run eager whenever the binding is on: on an H200, with TorchTitan's
MoE compile, taking the binding out made a GPU-bound deepseek_v3 run 2.85 % faster
(docs/performance.md).

So the bound function runs its backend through an :class:`ExpertsRunner`, which decides once,
at its first call (``parallelize_fn`` has run by then), whether to compile it:

- TorchTitan compiles the model (``[compile] enable``, ``"model"`` in ``components``);
- the backend is traceable with ``fullgraph=True`` (``torch``, or registered as such);
- no MoE block was made eager by ``rocm.moe_eager_compile``: those blocks stay wholly eager,
  experts included, which is the point of the mixed strategy.

The decision, and why, is logged once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torchtitan.tools.logging import logger

from titan_rocm.workarounds import moe_compile
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

    @classmethod
    def from_job(cls, job_config: Any, parallel_dims: Any, enabled: bool) -> CompileRequest:
        """Read ``[compile] backend`` and the EP degree from TorchTitan's objects."""
        backend = getattr(getattr(job_config, "compile", None), "backend", None) or "inductor"
        return cls(enabled, backend, bool(getattr(parallel_dims, "ep_enabled", False)))


NOT_COMPILED = CompileRequest(enabled=False)


def static_reason(backend: str, request: CompileRequest) -> str | None:
    """Why the experts stay eager whatever the blocks do, or None when that depends on them."""
    if not request.enabled:
        return "TorchTitan does not compile the model"
    if not is_compilable(backend):
        return (
            f"backend {backend!r} is not traceable with fullgraph (a registered backend opts "
            "in with register_backend(..., compilable=True))"
        )
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
        """Whether to compile now, and why.

        Under the mixed strategy every MoE block is eager, and an eager block counts its
        forward before running it: at the experts' first call the count is already there.
        """
        reason = static_reason(self.backend, self.request)
        if reason is not None:
            return False, reason
        if moe_compile.eager_forward_calls():
            return False, (
                "MoE blocks run eager (rocm.moe_eager_compile); their experts stay eager with "
                "them"
            )
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
        state = "compiled" if self.compiled else "eager"
        logger.info(
            f"titan-rocm: grouped-MM experts function (backend {self.backend!r}) runs "
            f"{state}: {self.why}"
        )
        return run

    def __call__(self, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, x: torch.Tensor,
                 num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        if self._run is None:
            self._run = self._first_call()
        return self._run(w1, w2, w3, x, num_tokens_per_expert)
