"""Which backward an attention call gets: aiter's own dispatch, or aiter's generic CK kernel.

A pure function of the call (architecture, head dims, dropout, bias/alibi, layout, dtype,
deterministic); no torch, no aiter. The one architecture-dependent fact it reads,
``aiter_fmha_v3_bwd_qk192_v128``, lives in :mod:`titan_rocm.archs`.

Why: aiter's ``_flash_attn_backward`` picks its hand-written fmha_v3 ASM backward when its
own checks pass. On gfx942 that kernel has no q/k 192 / v 128 (DeepSeek MLA) variant; a
caller that pads v to 192, or an arch misdetection (``GPU_ARCHS="gfx942;gfx950"`` makes
aiter's ``get_gfx()`` answer gfx950), reaches an ASM kernel that fails ("invalid argument
for fmha_v3_bwd") or worse. aiter's generic CK ``mha_bwd`` handles every such call, so on
those architectures titan-rocm calls it directly and never pads v.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from titan_rocm.archs import ARCHS, normalize_arch

MLA_QK_HEAD_DIM = 192
"""q/k head dim of DeepSeek V3 MLA: qk_nope 128 + qk_rope 64."""
MLA_V_HEAD_DIM = 128
"""v head dim of DeepSeek V3 MLA."""

LAYOUTS: tuple[str, ...] = ("bshd", "bhsd", "thd")
"""Tensor layouts: batch-mode (either memory order; aiter reads strides) or varlen ``thd``."""
DTYPES: tuple[str, ...] = ("bfloat16", "float16")
"""Element types aiter's flash attention kernels accept."""

CK = "ck"
AITER = "aiter"
BACKEND_LABELS: dict[str, str] = {
    CK: "ck (mha_bwd)",
    AITER: "aiter (_flash_attn_backward)",
}
"""How each backend is shown in ``titan-rocm plan`` and logs."""


@dataclass(frozen=True)
class BackwardCall:
    """What the routing looks at for one attention backward.

    Raises:
        ValueError: a field has a value the routing cannot reason about (names it and
            what is accepted).
    """

    arch: str | None
    """``gfx`` target of the device (``gfx942`` or ``gfx942:sramecc+:xnack-``); None off ROCm."""
    hdim_q: int
    hdim_k: int
    hdim_v: int
    dropout_p: float = 0.0
    has_bias: bool = False
    has_alibi: bool = False
    layout: str = "bshd"
    dtype: str = "bfloat16"
    """``bfloat16``/``float16`` (a ``torch.`` prefix is accepted)."""
    deterministic: bool = False

    def __post_init__(self) -> None:
        for name in ("hdim_q", "hdim_k", "hdim_v"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} = {value!r} is not valid; accepted: a positive int")
        if self.hdim_q != self.hdim_k:
            raise ValueError(
                f"hdim_q = {self.hdim_q} and hdim_k = {self.hdim_k} differ; "
                "flash attention needs equal q and k head dims"
            )
        if not 0.0 <= float(self.dropout_p) < 1.0:
            raise ValueError(f"dropout_p = {self.dropout_p!r} is not valid; accepted: 0 <= p < 1")
        if self.layout not in LAYOUTS:
            raise ValueError(
                f"layout = {self.layout!r} is not valid; accepted: {', '.join(LAYOUTS)}"
            )
        dtype = str(self.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(
                f"dtype = {self.dtype!r} is not valid for aiter flash attention; "
                f"accepted: {', '.join(DTYPES)}"
            )
        object.__setattr__(self, "dtype", dtype)
        if self.arch is not None:
            object.__setattr__(self, "arch", normalize_arch(self.arch))


@dataclass(frozen=True)
class Route:
    """The decision: ``backend`` is ``"ck"`` or ``"aiter"``; ``reason`` says why."""

    backend: str
    reason: str

    @property
    def label(self) -> str:
        """``ck (mha_bwd)`` or ``aiter (_flash_attn_backward)``."""
        return BACKEND_LABELS[self.backend]


def _shape(call: BackwardCall) -> str:
    return f"q/k {call.hdim_q}, v {call.hdim_v}"


def route_backward(call: BackwardCall) -> Route:
    """Route one attention backward to CK (``mha_bwd``) or to aiter's own dispatch.

    CK is chosen where aiter's fmha_v3 ASM backward must not run: the MLA shape q/k 192 with
    v 128, or v padded to 192, on an architecture whose ``aiter_fmha_v3_bwd_qk192_v128``
    fact is False (gfx942, gfx90a) or unknown. Dropout, bias, alibi and deterministic do not
    change that choice: CK's ``mha_bwd`` implements all of them.
    """
    if call.arch is None:
        return Route(AITER, "not an AMD GPU (no gfx arch): nothing to route")
    mla_shape = call.hdim_q == MLA_QK_HEAD_DIM and call.hdim_v in (
        MLA_V_HEAD_DIM,
        MLA_QK_HEAD_DIM,
    )
    if not mla_shape:
        return Route(
            AITER,
            f"{_shape(call)} is not DeepSeek MLA's shape; aiter's own dispatch handles it",
        )
    if call.layout == "thd":
        return Route(
            AITER,
            "varlen (thd) backward goes through aiter's mha_varlen_bwd path; "
            "titan-rocm routes only the batch-mode backward",
        )
    facts = ARCHS.get(call.arch)
    padded = call.hdim_v == MLA_QK_HEAD_DIM
    if facts is not None and facts.aiter_fmha_v3_bwd_qk192_v128:
        return Route(
            AITER,
            f"{call.arch}'s aiter fmha_v3 backward supports q/k 192 with v 128; "
            f"aiter's own dispatch chooses for {_shape(call)}",
        )
    if facts is None:
        why = f"{call.arch} is not an architecture titan-rocm knows; CK is aiter's generic path"
    elif padded:
        why = (
            f"q/k 192 with v 192 is MLA with v padded; aiter's fmha_v3 ASM backward must not "
            f"take it on {call.arch}; CK computes it (titan-rocm itself never pads v)"
        )
    else:
        why = f"aiter's fmha_v3 ASM backward has no q/k 192, v 128 kernel on {call.arch}"
    return Route(CK, why)


@dataclass(frozen=True)
class Flags:
    """The non-shape inputs of one route-table row."""

    dropout_p: float = 0.0
    has_bias: bool = False
    has_alibi: bool = False
    layout: str = "bshd"
    dtype: str = "bfloat16"
    deterministic: bool = False


DEFAULT_TABLE_ARCHS: tuple[str | None, ...] = ("gfx942", "gfx950", "gfx90a", None)
"""Architectures of the documented route table (None: a CUDA machine)."""
DEFAULT_TABLE_SHAPES: tuple[tuple[int, int], ...] = ((192, 128), (128, 128), (192, 192))
"""(q/k, v) head dims of the documented route table: MLA, plain MHA, MLA with v padded."""


def arch_label(arch: str | None) -> str:
    """How an architecture is named in route tables (``cuda`` for None)."""
    return "cuda" if arch is None else normalize_arch(arch)


def route_table(
    archs: Iterable[str | None] = DEFAULT_TABLE_ARCHS,
    shapes: Iterable[tuple[int, int]] = DEFAULT_TABLE_SHAPES,
    flags: Sequence[Flags] = (Flags(),),
) -> list[dict[str, Any]]:
    """One row per (arch, shape, flags): what :func:`route_backward` decides.

    Rows are JSON-able: ``{"arch", "shape": {"qk", "v"}, "flags", "backward", "reason"}``.
    """
    rows: list[dict[str, Any]] = []
    for arch in archs:
        for qk, v in shapes:
            for f in flags:
                route = route_backward(BackwardCall(arch, qk, qk, v, **asdict(f)))
                rows.append(
                    {
                        "arch": arch_label(arch),
                        "shape": {"qk": qk, "v": v},
                        "flags": asdict(f),
                        "backward": route.label,
                        "reason": route.reason,
                    }
                )
    return rows


def format_route_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of :func:`route_table` rows (default flags: arch, shape, route)."""
    lines = [
        "| arch | q/k head dim | v head dim | backward | why |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['arch']} | {row['shape']['qk']} | {row['shape']['v']} | "
            f"{row['backward']} | {row['reason']} |"
        )
    return "\n".join(lines)
