"""Grouped-MM backends for TorchTitan's MoE experts, by name, and the registry users extend.

A backend has the signature of TorchTitan 0.2.2's ``_run_experts_grouped_mm``
(docs/grouped-mm.md)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from titan_rocm.platform import PlatformFacts

ExpertsFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]

AUTO = "auto"
"""Not a backend: picks ``primus_turbo`` when it imports on a ROCm build, else ``torch``."""


def torch_grouped_mm(
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    x: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
) -> torch.Tensor:
    """TorchTitan's stock path (``torch._grouped_mm`` in BF16), the same operations, so torchao's
    float8 grouped-MM tensors intercept it the same way."""
    offsets = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
    xb = x.bfloat16()
    gate = torch._grouped_mm(xb, w1.bfloat16().transpose(-2, -1), offs=offsets)
    up = torch._grouped_mm(xb, w3.bfloat16().transpose(-2, -1), offs=offsets)
    h = F.silu(gate) * up
    out = torch._grouped_mm(h, w2.bfloat16().transpose(-2, -1), offs=offsets)
    return out.type_as(x)


def loop_grouped_mm(
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    x: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
) -> torch.Tensor:
    """One matmul per expert in ``x``'s dtype: runs on every device and dtype.

    It syncs the counts to the host, so it always runs eager."""
    counts = [int(c) for c in num_tokens_per_expert.tolist()]
    used = sum(counts)
    pieces = []
    for expert, x_e in enumerate(torch.split(x[:used], counts, dim=0)):
        w1_e = w1[expert].to(x.dtype)
        w3_e = w3[expert].to(x.dtype)
        w2_e = w2[expert].to(x.dtype)
        h = F.silu(x_e @ w1_e.transpose(0, 1)) * (x_e @ w3_e.transpose(0, 1))
        pieces.append(h @ w2_e.transpose(0, 1))
    # Padding rows (tokens TorchTitan added for alignment) get zeros.
    pieces.append(x.new_zeros((x.shape[0] - used, w2.shape[1])))
    return torch.cat(pieces, dim=0)


PRIMUS_TURBO_MODULE = "primus_turbo.pytorch"


def primus_turbo_status(facts: PlatformFacts | None = None) -> str | None:
    """Why Primus-Turbo's grouped GEMM cannot be used here, or None when it can."""
    if facts is not None and facts.primus_turbo is not None:
        if facts.primus_turbo:
            return None
        return "primus_turbo is not installed on the simulated machine (--primus-turbo absent)"
    if importlib.util.find_spec("primus_turbo") is None:
        return "primus_turbo is not installed (Primus-Turbo, github.com/AMD-AGI/Primus-Turbo)"
    try:
        turbo = importlib.import_module(PRIMUS_TURBO_MODULE)
    except Exception as exc:  # aiter-like packages raise RuntimeError etc. without a GPU
        return f"import {PRIMUS_TURBO_MODULE} failed: {type(exc).__name__}: {exc}"
    ops = getattr(turbo, "ops", None)
    if not callable(getattr(ops, "grouped_gemm", None)):
        return f"{PRIMUS_TURBO_MODULE}.ops.grouped_gemm not found in this Primus-Turbo version"
    return None


def primus_turbo_grouped_mm(
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    x: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
) -> torch.Tensor:
    """Primus-Turbo's CK grouped GEMM in BF16; TorchTitan's padding rows join the last group (its
    group sizes must cover every row) without a host sync."""
    # The group sizes once per call, for all three GEMMs.
    group_lens = _group_lens(num_tokens_per_expert.to(torch.int64), x.shape[0])
    xb = x.bfloat16()
    gate = _turbo_gemm(xb, w1.bfloat16().transpose(-2, -1), group_lens)
    up = _turbo_gemm(xb, w3.bfloat16().transpose(-2, -1), group_lens)
    h = F.silu(gate) * up
    out = _turbo_gemm(h, w2.bfloat16().transpose(-2, -1), group_lens)
    return out.type_as(x)


def _group_lens(counts: torch.Tensor, rows: int) -> torch.Tensor:
    """Rows per group, with the padding rows past the last group folded into it (Primus-Turbo
    needs the groups to cover every row); no host sync."""
    group_lens = counts.clone()
    group_lens[-1] += rows - group_lens.sum()
    return group_lens


def _turbo_gemm(A: torch.Tensor, B_t: torch.Tensor, group_lens: torch.Tensor) -> torch.Tensor:
    turbo = importlib.import_module(PRIMUS_TURBO_MODULE)
    return turbo.ops.grouped_gemm(A, B_t.transpose(-2, -1), group_lens, trans_b=True)


# -- the FP8 route of primus_turbo ------------------------------------------------------------

FP8 = ":fp8"
"""Suffix of a bound route that runs a backend's FP8 form (``primus_turbo:fp8``)."""
FP8_PARAMETERS: tuple[str, ...] = ("a", "b", "group_lens", "trans_b", "config")
"""What titan-rocm passes to ``primus_turbo.pytorch.ops.grouped_gemm_fp8``: declared by every
release from v0.1.0 (8f8fea65) to main (a6a16cdc, v0.4.0+)."""
FP8_CONFIG_MODULES: tuple[str, ...] = (
    "primus_turbo.pytorch.core.low_precision",  # v0.2.0 on (19ee6a5a ... a6a16cdc)
    "primus_turbo.pytorch.core.float8",  # v0.1.x (8f8fea65)
)
"""Where Primus-Turbo keeps ``Float8QuantConfig``, ``Format`` and ``ScalingGranularity``
(AMD-AGI/Primus ``primus/backends/torchtitan/models/moe/moe.py`` tries both)."""


def _fp8_config_classes() -> tuple[Any, Any, Any] | None:
    """``(Float8QuantConfig, Format, ScalingGranularity)`` of the installed Primus-Turbo."""
    for name in FP8_CONFIG_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # an absent module in this release
            continue
        classes = tuple(getattr(module, c, None) for c in
                        ("Float8QuantConfig", "Format", "ScalingGranularity"))
        if all(c is not None for c in classes) and hasattr(classes[1], "E4M3") and hasattr(
                classes[2], "TENSORWISE"):
            return classes  # type: ignore[return-value]
    return None


def primus_turbo_fp8_status(facts: PlatformFacts | None = None) -> str | None:
    """Why Primus-Turbo's FP8 grouped GEMM cannot be used here, or None; by feature detection
    (:data:`FP8_PARAMETERS`, an E4M3 tensorwise config), not a version guess."""
    missing = primus_turbo_status(facts)
    if missing is not None or (facts is not None and facts.primus_turbo is not None):
        return missing
    turbo = importlib.import_module(PRIMUS_TURBO_MODULE)
    fn = getattr(turbo.ops, "grouped_gemm_fp8", None)
    if not callable(fn):
        return (f"this Primus-Turbo has no {PRIMUS_TURBO_MODULE}.ops.grouped_gemm_fp8 (its FP8 "
                "grouped GEMM)")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return f"{PRIMUS_TURBO_MODULE}.ops.grouped_gemm_fp8 has no readable signature"
    lacking = [name for name in FP8_PARAMETERS if name not in params]
    if lacking:
        return (f"{PRIMUS_TURBO_MODULE}.ops.grouped_gemm_fp8 lacks the parameters "
                f"{', '.join(lacking)} (it takes {', '.join(params)})")
    if _fp8_config_classes() is None:
        return (f"no Float8QuantConfig with Format.E4M3 and ScalingGranularity.TENSORWISE in "
                f"{' or '.join(FP8_CONFIG_MODULES)}")
    return None


class _Unwrapped(torch.autograd.Function):
    """A wrapper tensor's one inner tensor, differentiably: the gradient passes through."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor) -> torch.Tensor:
        names, _ = weight.__tensor_flatten__()  # type: ignore[attr-defined]
        return getattr(weight, names[0]).detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def plain_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` as a plain tensor Primus-Turbo's kernels can read.

    torchao's ``ScaledGroupedMMTensor`` has no storage of its own and survives ``.bfloat16()``,
    so it is unwrapped through an identity whose gradient flows to the wrapped parameter."""
    if not is_traceable_wrapper_subclass(weight):
        return weight
    names, _ = weight.__tensor_flatten__()  # type: ignore[attr-defined]
    return _Unwrapped.apply(weight) if len(names) == 1 else weight


def _turbo_gemm_fp8(A: torch.Tensor, B: torch.Tensor, group_lens: torch.Tensor) -> torch.Tensor:
    """``A @ B[g].T`` per group through ``grouped_gemm_fp8``, E4M3, one dynamic scale per
    tensor: the config AMD-AGI/Primus's ``models/moe/moe.py`` (be88d349) trains DeepSeek with."""
    turbo = importlib.import_module(PRIMUS_TURBO_MODULE)
    classes = _fp8_config_classes()
    assert classes is not None, "primus_turbo_fp8_status() was not checked"
    config_cls, fmt, granularity = classes
    config = config_cls(format=fmt.E4M3, granularity=granularity.TENSORWISE)
    return turbo.ops.grouped_gemm_fp8(A, B, group_lens=group_lens, trans_b=True, config=config)


def primus_turbo_fp8_grouped_mm(
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    x: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
) -> torch.Tensor:
    """:func:`primus_turbo_grouped_mm` in FP8 (E4M3 tensorwise dynamic scaling), BF16 in and out."""
    group_lens = _group_lens(num_tokens_per_expert.to(torch.int64), x.shape[0])
    xb = x.bfloat16()
    w1, w2, w3 = (plain_weight(w).bfloat16() for w in (w1, w2, w3))
    h = F.silu(_turbo_gemm_fp8(xb, w1, group_lens)) * _turbo_gemm_fp8(xb, w3, group_lens)
    return _turbo_gemm_fp8(h, w2, group_lens).type_as(x)


GemmFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""One grouped GEMM, ``fn(A, B_t, offs)``: TorchTitan 0.3.0's ``GroupedExperts._grouped_mm``
seam, which experts with their own SwiGLU (gpt_oss) call."""


def loop_gemm(A: torch.Tensor, B_t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """:func:`loop_grouped_mm`'s GEMM alone: one matmul per group, in ``A``'s dtype; rows past
    the last group get zeros. Reads the offsets on the host, like :func:`loop_grouped_mm`."""
    pieces, start = [], 0
    for group, end in enumerate(int(e) for e in offs.tolist()):
        pieces.append(A[start:end] @ B_t[group].to(A.dtype))
        start = end
    pieces.append(A.new_zeros((A.shape[0] - start, B_t.shape[-1])))
    return torch.cat(pieces, dim=0)


def primus_turbo_gemm(A: torch.Tensor, B_t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """:func:`primus_turbo_grouped_mm`'s GEMM alone (padding rows folded into the last group)."""
    ends = offs.to(torch.int64)
    return _turbo_gemm(A, B_t, _group_lens(torch.diff(ends, prepend=ends.new_zeros(1)),
                                           A.shape[0]))


def primus_turbo_fp8_gemm(A: torch.Tensor, B_t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """:func:`primus_turbo_fp8_grouped_mm`'s GEMM alone."""
    ends = offs.to(torch.int64)
    lens = _group_lens(torch.diff(ends, prepend=ends.new_zeros(1)), A.shape[0])
    return _turbo_gemm_fp8(A, plain_weight(B_t).transpose(-2, -1), lens)


GEMM_FORMS: dict[str, GemmFn] = {"loop": loop_gemm, "primus_turbo": primus_turbo_gemm,
                                 "primus_turbo" + FP8: primus_turbo_fp8_gemm}
"""Built-in backends that also exist as one grouped GEMM (``torch`` needs none: it is the
stock ``torch._grouped_mm``); a registered backend has only its experts form."""


BUILTIN: dict[str, ExpertsFn] = {
    "torch": torch_grouped_mm,
    "loop": loop_grouped_mm,
    "primus_turbo": primus_turbo_grouped_mm,
}

FP8_FORMS: dict[str, ExpertsFn] = {"primus_turbo": primus_turbo_fp8_grouped_mm}
"""Backends with an FP8 form, bound as ``<name>:fp8`` (not names users pick: the precision
is ``[rocm] grouped_mm_precision``)."""

_registry: dict[str, ExpertsFn] = dict(BUILTIN)
_lock = threading.Lock()

_compilable: set[str] = {"torch"}
"""Backends traceable by ``torch.compile(fullgraph=True)``. Not ``loop`` (host sync), not
``primus_turbo`` (an opaque extension kernel)."""

CALLS: Counter[str] = Counter()
"""Calls of each backend through the bound function since start (or :func:`reset_calls`)."""


def register_backend(
    name: str, fn: ExpertsFn, *, replace: bool = False, compilable: bool = False
) -> None:
    """Make ``fn`` available as ``[rocm] grouped_mm_backend = "<name>"`` (docs/grouped-mm.md).

    ``compilable=True``: ``fn`` traces under ``fullgraph``. Raises ValueError for an empty,
    ``auto`` or taken name (unless ``replace``), TypeError for an ``fn`` not callable."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"grouped-MM backend name must be a non-empty string, got {name!r}")
    if name == AUTO:
        raise ValueError(f"grouped-MM backend name {AUTO!r} is reserved (it picks a backend)")
    if not callable(fn):
        raise TypeError(f"grouped-MM backend {name!r} must be callable, got {fn!r}")
    with _lock:
        if name in _registry and not replace:
            raise ValueError(
                f"grouped-MM backend {name!r} is already registered; pass replace=True to "
                "replace it"
            )
        _registry[name] = fn
        if compilable:
            _compilable.add(name)
        else:
            _compilable.discard(name)


def is_compilable(name: str) -> bool:
    """Backend ``name`` may be compiled with ``fullgraph=True``."""
    return name in _compilable


def backend_names() -> list[str]:
    """Accepted values of ``[rocm] grouped_mm_backend``: ``auto`` and every registered name."""
    return [AUTO, *_registry]


def get_backend(name: str) -> ExpertsFn:
    """The function registered as ``name``; ValueError names the accepted names."""
    try:
        return _registry[name]
    except KeyError:
        raise ValueError(
            f"[rocm] grouped_mm_backend = {name!r} is not a grouped-MM backend; accepted: "
            f"{', '.join(backend_names())}"
        ) from None


def experts_function(route: str) -> ExpertsFn:
    """The function a bound ``route`` runs (a backend name or ``<name>:fp8``); ValueError otherwise.
    """
    if route.endswith(FP8) and route.removesuffix(FP8) in FP8_FORMS:
        return FP8_FORMS[route.removesuffix(FP8)]
    return get_backend(route)


def validate_name(name: str) -> None:
    """Raise ValueError unless ``name`` is ``auto`` or a registered backend."""
    if name != AUTO:
        get_backend(name)


def resolve(name: str, is_rocm: bool, facts: PlatformFacts | None = None) -> tuple[str, str]:
    """The backend ``name`` stands for here, and why; ValueError for a name not accepted."""
    validate_name(name)
    if name != AUTO:
        return name, "requested"
    if not is_rocm:
        return "torch", "auto: not a ROCm build"
    missing = primus_turbo_status(facts)
    if missing is None:
        if facts is not None and facts.primus_turbo is not None:
            return "primus_turbo", "auto: Primus-Turbo is present on the simulated machine"
        return "primus_turbo", "auto: Primus-Turbo imports on this ROCm build"
    return "torch", f"auto: {missing}"


def reset_calls() -> None:
    """Forget the call counts (tests, benchmarks)."""
    CALLS.clear()


def call_counts() -> dict[str, int]:
    """Calls of each backend through titan-rocm's binding in this process."""
    return dict(CALLS)
