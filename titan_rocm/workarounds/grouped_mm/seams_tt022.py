"""TorchTitan 0.2.2's seam of the grouped-MM binding: the module global the experts' ``forward``
really reads, patched per model (``moe.py`` may load twice; docs/grouped-mm.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

from titan_rocm import patches
from titan_rocm.log import log
from titan_rocm.workarounds.grouped_mm.backends import CALLS, ExpertsFn, experts_function
from titan_rocm.workarounds.grouped_mm.experts_compile import (
    NOT_COMPILED,
    CompileRequest,
    ExpertsRunner,
    static_reason,
)

NAME = "grouped_mm"
"""Who the binding's patches are ``by``."""

TARGET = "_run_experts_grouped_mm"
"""The module global ``GroupedExperts.forward`` calls."""
BACKEND_ATTR = "titan_rocm_backend"
"""Attribute of a bound function: the backend name."""
RUNNER_ATTR = "titan_rocm_runner"
"""Attribute of a bound function: its :class:`ExpertsRunner` (eager or compiled, and why)."""

_EXPERTS_CLASS = "GroupedExperts"
_GPT_OSS_CLASS = "GptOssGroupedExperts"


def _class_names(module: nn.Module) -> set[str]:
    return {cls.__name__ for cls in type(module).__mro__}


def experts_globals(module: nn.Module) -> dict[str, Any] | None:
    """The globals a ``GroupedExperts.forward`` reads, or None; matched by name and attributes,
    never class identity (moe.py may be loaded twice)."""
    if _EXPERTS_CLASS not in _class_names(module):
        return None
    if not all(hasattr(module, attr) for attr in ("w1", "w2", "w3", "use_grouped_mm")):
        return None
    forward_globals = getattr(type(module).forward, "__globals__", None)
    if forward_globals is None or TARGET not in forward_globals:
        return None
    return forward_globals


def find_grouped_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every TorchTitan ``GroupedExperts`` in ``model``."""
    return [(name, m) for name, m in model.named_modules() if experts_globals(m) is not None]


def find_gpt_oss_experts(model: nn.Module) -> list[str]:
    """Qualified names of gpt_oss experts (which titan-rocm does not bind)."""
    return [name for name, m in model.named_modules() if _GPT_OSS_CLASS in _class_names(m)]


def make_bound(
    backend: str, request: CompileRequest = NOT_COMPILED
) -> Callable[..., torch.Tensor]:
    """The function bound in place of ``_run_experts_grouped_mm``: counts, then calls ``backend``,
    compiled where :mod:`.experts_compile` allows. Raises ValueError for an unknown backend."""
    fn: ExpertsFn = ExpertsRunner(backend, experts_function(backend), request)

    def _run_experts_grouped_mm_dynamic(
        w1: torch.Tensor,
        w2: torch.Tensor,
        w3: torch.Tensor,
        x: torch.Tensor,
        num_tokens_per_expert: torch.Tensor,
    ) -> torch.Tensor:
        CALLS[backend] += 1
        return fn(w1, w2, w3, x, num_tokens_per_expert)

    setattr(_run_experts_grouped_mm_dynamic, BACKEND_ATTR, backend)
    setattr(_run_experts_grouped_mm_dynamic, RUNNER_ATTR, fn)
    return _run_experts_grouped_mm_dynamic


def _unique_globals(model: nn.Module) -> Iterator[dict[str, Any]]:
    seen: set[int] = set()
    for _, module in find_grouped_experts(model):
        forward_globals = experts_globals(module)
        assert forward_globals is not None
        if id(forward_globals) not in seen:
            seen.add(id(forward_globals))
            yield forward_globals


def bind(model: nn.Module, backend: str, request: CompileRequest = NOT_COMPILED) -> list[str]:
    """Bind every ``GroupedExperts`` of ``model`` to ``backend``; return the patched modules.
    Binding again rebinds, never wraps."""
    bound = make_bound(backend, request)
    patched = []
    for forward_globals in _unique_globals(model):
        patches.patch(forward_globals, TARGET, lambda _stock: bound, by=NAME, refresh=True)
        patched.append(str(forward_globals.get("__name__", "?")))
    return patched


def unbind_all() -> None:
    """Put back what was bound before titan-rocm, whoever holds the binding (tests)."""
    patches.restore(by=NAME)


def bound_backend(module: nn.Module) -> str | None:
    """The titan-rocm backend ``module``'s forward would call now, or None (not bound)."""
    forward_globals = experts_globals(module)
    if forward_globals is None:
        return None
    return getattr(forward_globals[TARGET], BACKEND_ATTR, None)


def bound_runner(module: nn.Module) -> ExpertsRunner | None:
    """The runner of the function ``module``'s forward would call now, or None (not bound)."""
    forward_globals = experts_globals(module)
    if forward_globals is None:
        return None
    return getattr(forward_globals[TARGET], RUNNER_ATTR, None)


def layer_backends(model: nn.Module) -> dict[str, str]:
    """Per experts module of ``model``: what its forward calls, read from the live globals."""
    result: dict[str, str] = {}
    for name, module in find_grouped_experts(model):
        if not module.use_grouped_mm:
            result[name] = "TorchTitan for-loop (use_grouped_mm = false; binding unused)"
            continue
        backend = bound_backend(module)
        if backend is None:
            current = experts_globals(module)[TARGET]  # type: ignore[index]
            result[name] = f"stock {getattr(current, '__qualname__', current)!s} (not bound)"
        else:
            result[name] = backend
    for name in find_gpt_oss_experts(model):
        result[name] = "not covered (gpt_oss has its own grouped-MM function)"
    return result


class Seam:
    """:class:`~.workaround.GroupedMMSeam` for TorchTitan 0.2.2."""

    counts_note = ""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def check(self, model: nn.Module) -> str | None:
        """Why ``model``'s experts cannot be bound (None: they can)."""
        experts = find_grouped_experts(model)
        if not experts:
            if find_gpt_oss_experts(model):
                return "gpt_oss experts have their own grouped-MM function (not covered)"
            return "model has no MoE blocks"
        if not any(m.use_grouped_mm for _, m in experts):
            return (
                "MoE experts use TorchTitan's for-loop path (moe_args.use_grouped_mm = false; "
                "TorchTitan sets it on devices below CUDA capability 9.0)"
            )
        return None

    def compile_request(self) -> CompileRequest:
        """How the experts function should run, from the job (after its decisions)."""
        return CompileRequest.from_context(self.ctx)

    def bind(self, model: nn.Module, backend: str, why: str) -> list[str]:
        """Bind ``backend`` in every experts module's globals; return the names patched."""
        patched = bind(model, backend, self.compile_request())
        log.info("titan-rocm: MoE grouped MM bound to backend %r (%s) in %s",
                 backend, why, ", ".join(patched))
        return patched

    def layer_backends(self, model: nn.Module) -> dict[str, str]:
        """What each experts module calls."""
        return layer_backends(model)

    def experts_compile(self, backend: str) -> str:
        """How the bound experts function runs, for the plan."""
        request = self.compile_request()
        reason = static_reason(backend, request)
        return (
            f"eager: {reason}" if reason is not None else
            f"compiled with fullgraph (backend {request.backend!r}) at the first call, as "
            "stock apply_compile compiles TorchTitan's own"
        )
