"""Grouped-MM binding: point the live model's MoE experts at a chosen grouped-MM backend.

``GroupedExperts.forward`` (``torchtitan/models/moe/moe.py``) looks up the module global
``_run_experts_grouped_mm`` on every call. The same file can be loaded twice under two module
names (TorchTitan's model folders are PEP-420 namespace directories), so patching an
attribute chain imported here may miss the module the model really uses. This workaround
therefore finds the model's ``GroupedExperts`` instances and writes into
``type(m).forward.__globals__`` -- the dictionary their ``forward`` really reads.

The bound function is called ``_run_experts_grouped_mm_dynamic``: stock llama4
``apply_compile`` checks that name (its "already patched" test) and then leaves it alone
instead of wrapping it in ``torch.compile``. Where stock would have compiled its own function,
the bound one compiles a traceable backend itself (:mod:`.experts_compile`).

gpt_oss is NOT covered: ``GptOssGroupedExperts`` has its own ``_run_experts_grouped_mm`` with
biases and a clamped SwiGLU, a different signature; its layers are reported as not covered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
from torchtitan.tools.logging import logger

from titan_rocm.converters.base import Context, Workaround
from titan_rocm.workarounds.grouped_mm.backends import (
    AUTO,
    CALLS,
    ExpertsFn,
    backend_names,
    get_backend,
    is_compilable,
    primus_turbo_status,
    register_backend,
    reset_calls,
    resolve,
    validate_name,
)
from titan_rocm.workarounds.grouped_mm.experts_compile import (
    NOT_COMPILED,
    CompileRequest,
    ExpertsRunner,
    static_reason,
)

__all__ = [
    "GroupedMMBinding",
    "register_backend",
    "is_compilable",
    "CompileRequest",
    "backend_names",
    "call_counts",
    "reset_calls",
    "find_grouped_experts",
    "bind",
    "unbind_all",
    "layer_backends",
]

TARGET = "_run_experts_grouped_mm"
"""The module global ``GroupedExperts.forward`` calls."""
BOUND_NAME = "_run_experts_grouped_mm_dynamic"
"""Name of the bound function; stock llama4 ``apply_compile`` does not wrap a function whose
``__qualname__`` contains it."""
BACKEND_ATTR = "titan_rocm_backend"
"""Attribute of a bound function: the backend name."""
RUNNER_ATTR = "titan_rocm_runner"
"""Attribute of a bound function: its :class:`ExpertsRunner` (eager or compiled, and why)."""

QUANTIZED_EXPERTS_CONVERTERS = ("quantize.grouped_mm.float8", "quantize.grouped_mm.mx")
"""TorchTitan converters that quantize the experts by swapping their weights for torchao
tensors that intercept ``torch._grouped_mm``: only the ``torch`` backend goes through it."""

_EXPERTS_CLASS = "GroupedExperts"
_GPT_OSS_CLASS = "GptOssGroupedExperts"

# id(globals dict) -> (the dict, what was bound there before titan-rocm), for unbind_all.
_originals: dict[int, tuple[dict[str, Any], Any]] = {}


def _class_names(module: nn.Module) -> set[str]:
    return {cls.__name__ for cls in type(module).__mro__}


def experts_globals(module: nn.Module) -> dict[str, Any] | None:
    """The globals ``forward`` of a TorchTitan ``GroupedExperts`` reads, or None if not one.

    Matched by class name (anywhere in the MRO, so FSDP's subclass matches too), the
    ``w1``/``w2``/``w3``/``use_grouped_mm`` attributes, and a forward whose module defines
    ``_run_experts_grouped_mm`` -- never by class identity, since moe.py may be loaded twice.
    """
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
    """The function bound in place of ``_run_experts_grouped_mm``: counts, then calls ``backend``
    (compiled at the first call when ``request`` and the blocks allow it, see
    :mod:`.experts_compile`).

    Raises:
        ValueError: ``backend`` is not registered.
    """
    fn: ExpertsFn = ExpertsRunner(backend, get_backend(backend), request)

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

    ``request``: how TorchTitan compiles the model; the default keeps the experts eager.
    Idempotent: binding again replaces the bound function, it never wraps it.
    """
    bound = make_bound(backend, request)
    patched = []
    for forward_globals in _unique_globals(model):
        current = forward_globals[TARGET]
        if not hasattr(current, BACKEND_ATTR):
            _originals.setdefault(id(forward_globals), (forward_globals, current))
        forward_globals[TARGET] = bound
        patched.append(str(forward_globals.get("__name__", "?")))
    return patched


def unbind_all() -> None:
    """Put back what was bound before titan-rocm, in every module it bound (tests)."""
    while _originals:
        _, (forward_globals, original) = _originals.popitem()
        forward_globals[TARGET] = original


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


def quantized_experts_converters(job_config: Any) -> list[str]:
    """The job's converters (in ``[model] converters``) that quantize the MoE experts."""
    converters = getattr(getattr(job_config, "model", None), "converters", None) or []
    return [name for name in converters if name in QUANTIZED_EXPERTS_CONVERTERS]


def call_counts() -> dict[str, int]:
    """Calls of each backend through titan-rocm's bound function in this process."""
    return dict(CALLS)


class GroupedMMBinding(Workaround):
    """Binds the MoE experts' ``_run_experts_grouped_mm`` to ``[rocm] grouped_mm_backend``."""

    name = "grouped_mm"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.requested = ctx.settings.grouped_mm_backend
        validate_name(self.requested)  # ValueError names the value and accepted names
        self.backend, self.why = resolve(self.requested, ctx.platform.is_rocm)
        quantized = quantized_experts_converters(ctx.job_config)
        if quantized and self.requested != "torch" and self.mode != "off":
            self._choose_for_quantized(quantized)
        self._patched: list[str] = []
        self._logged_counts = False
        self.compile_request = CompileRequest.from_job(
            ctx.job_config, ctx.parallel_dims, ctx.compile_enabled
        )

    def _choose_for_quantized(self, quantized: list[str]) -> None:
        names = ", ".join(quantized)
        if self.requested == AUTO:
            self.backend, self.why = "torch", f"auto: {names} quantizes through torch._grouped_mm"
        elif self.requested in ("loop", "primus_turbo"):
            raise ValueError(
                f"[rocm] grouped_mm_backend = {self.requested!r} would bypass {names}, which "
                "quantizes the experts through torch._grouped_mm; accepted with it: torch, auto"
            )
        else:
            logger.warning(
                f"titan-rocm: grouped-MM backend {self.requested!r} receives the experts' "
                f"weights as {names} made them (torchao tensors); it must handle them itself"
            )

    def _backend_missing(self) -> str | None:
        if self.backend == "primus_turbo":
            missing = primus_turbo_status()
            if missing:
                return f"[rocm] grouped_mm_backend = \"primus_turbo\" cannot be used: {missing}"
        return None

    def require(self) -> None:
        missing = self._backend_missing()
        if missing:
            raise ValueError(missing)

    def check(self, model: nn.Module) -> str | None:
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
        return self._backend_missing()

    def apply(self, model: nn.Module) -> None:
        self._patched = bind(model, self.backend, self.compile_request)
        logger.info(
            f"titan-rocm: MoE grouped MM bound to backend {self.backend!r} ({self.why}) in "
            f"{', '.join(self._patched)}"
        )

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        # One line after the first step proves from the run log which backend really ran.
        if not self._logged_counts:
            self._logged_counts = True
            logger.info(f"titan-rocm: grouped-MM backend calls after step 1: {call_counts()}")

    def plan(self, model: nn.Module) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "backend": self.backend,
            "why": self.why,
            "primus_turbo": primus_turbo_status() or "available",
            "accepted": backend_names(),
            "bound_in": list(self._patched),
            "experts_compile": self._experts_compile(model),
            "layers": layer_backends(model),
        }

    def _experts_compile(self, model: nn.Module) -> str:
        """For the plan: whether the experts function will run compiled, and why."""
        reason = static_reason(self.backend, self.compile_request)
        if reason is not None:
            return f"eager: {reason}"
        if self._mixed_compile_expected(model):
            return "eager: rocm.moe_eager_compile keeps the MoE blocks eager, experts included"
        return (
            f"compiled with fullgraph (backend {self.compile_request.backend!r}) at the first "
            "call, as stock apply_compile compiles TorchTitan's own"
        )

    def _mixed_compile_expected(self, model: nn.Module) -> bool:
        """A converter of this job runs rocm.moe_eager_compile, and its gate holds."""
        from titan_rocm.converters import converter_classes
        from titan_rocm.workarounds import workaround_class

        classes = converter_classes()
        listed = getattr(self.ctx.job_config.model, "converters", None) or []
        runs = any(
            "moe_eager_compile" in classes[name].workaround_names
            for name in listed
            if name in classes
        )
        return runs and workaround_class("moe_eager_compile")(self.ctx).gate(model) is None
