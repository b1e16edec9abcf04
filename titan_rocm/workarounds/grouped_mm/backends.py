"""Grouped-MM backends for TorchTitan's MoE experts, by name, and the registry users extend.

A backend computes the SwiGLU experts of one MoE layer, with the signature of TorchTitan
0.2.2's ``torchtitan.models.moe.moe._run_experts_grouped_mm``::

    fn(w1, w2, w3, x, num_tokens_per_expert) -> out

``w1``/``w3``: ``(E, hidden, dim)``, ``w2``: ``(E, dim, hidden)``, ``x``: ``(T, dim)`` tokens
sorted by expert, ``num_tokens_per_expert``: ``(E,)`` integer counts. Rows of ``x`` past
``num_tokens_per_expert.sum()`` are padding (TorchTitan fills them from a zero row); their
output rows are dropped by TorchTitan, so a backend may leave anything finite there.
``out`` has ``x``'s shape and dtype.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F

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
    """TorchTitan's stock path: ``torch._grouped_mm`` in BF16, result cast back to ``x``'s dtype.

    The same operations as the stock function (so torchao's float8 grouped-MM tensors
    intercept it the same way): BF16 whatever the input dtype, padding rows left as
    ``torch._grouped_mm`` leaves them.
    """
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
    """One ordinary matmul per expert, in ``x``'s dtype: runs on every device and dtype.

    Reads the counts on the host (one device-to-host sync per call), like TorchTitan's own
    for-loop path. Not traceable by ``torch.compile(fullgraph=True)``, so it always runs
    eager (its bound function is named so stock ``apply_compile`` leaves it alone).
    """
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
    """Why Primus-Turbo's grouped GEMM cannot be used here, or None when it can.

    On a simulated machine (``facts.primus_turbo`` set), what it was said to have; otherwise
    imports ``primus_turbo.pytorch`` (cached by Python after the first success).
    """
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
    """Primus-Turbo's CK grouped GEMM (``primus_turbo.pytorch.ops.grouped_gemm``) in BF16.

    Primus-Turbo requires the group sizes to cover every row of ``x``; TorchTitan's padding
    rows past the last group (zeros) are folded into the last expert's group, without a
    host sync; their outputs are zeros and TorchTitan drops them.
    """
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


GemmFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""One grouped GEMM, ``fn(A, B_t, offs) -> A[rows of g] @ B_t[g]`` per group ``g`` (``offs``:
cumulative row ends): TorchTitan 0.3.0's ``GroupedExperts._grouped_mm`` seam, which experts
with their own SwiGLU (gpt_oss) call."""


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


GEMM_FORMS: dict[str, GemmFn] = {"loop": loop_gemm, "primus_turbo": primus_turbo_gemm}
"""Built-in backends that also exist as one grouped GEMM (``torch`` needs none: it is the
stock ``torch._grouped_mm``); a registered backend has only its experts form."""


BUILTIN: dict[str, ExpertsFn] = {
    "torch": torch_grouped_mm,
    "loop": loop_grouped_mm,
    "primus_turbo": primus_turbo_grouped_mm,
}

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
    """Make ``fn`` available as ``[rocm] grouped_mm_backend = "<name>"``.

    Call it before TorchTitan builds the converters, e.g. at import of the module named in
    ``[experimental] custom_import``. ``fn`` takes ``(w1, w2, w3, x, num_tokens_per_expert)``
    and returns the experts' output for every row of ``x`` (see this module's docstring).
    ``compilable=True`` says ``torch.compile(fn, fullgraph=True)`` traces it: it is then
    compiled wherever TorchTitan would compile its own experts function.

    Raises:
        ValueError: ``name`` is empty, is ``auto``, or is taken (and ``replace`` is False).
        TypeError: ``fn`` is not callable.
    """
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
    """The function registered as ``name``.

    Raises:
        ValueError: naming ``name`` and the accepted names.
    """
    try:
        return _registry[name]
    except KeyError:
        raise ValueError(
            f"[rocm] grouped_mm_backend = {name!r} is not a grouped-MM backend; accepted: "
            f"{', '.join(backend_names())}"
        ) from None


def validate_name(name: str) -> None:
    """Raise ValueError unless ``name`` is ``auto`` or a registered backend."""
    if name != AUTO:
        get_backend(name)


def resolve(name: str, is_rocm: bool, facts: PlatformFacts | None = None) -> tuple[str, str]:
    """The backend ``name`` stands for here, and why: ``auto`` picks, others stand for themselves.

    Raises:
        ValueError: ``name`` is not accepted.
    """
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
