"""Which aiter function each MLA attention call gets, forward and backward: a pure decision (no
torch, no aiter), so every route can be tested off the GPU; docs/mla-ck-backward.md gives every
route and why."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from typing import Any

from titan_rocm.archs import ARCHS, normalize_arch
from titan_rocm.platform import SIMULATED_AITERS
from titan_rocm.workarounds.mla_ck_backward.aiter_releases import (
    SIMULATED_MARKERS,
    AiterRelease,
    marker_names,
    release_for,
)

MLA_QK_HEAD_DIM = 192
"""q/k head dim of DeepSeek V3 MLA: qk_nope 128 + qk_rope 64."""
MLA_V_HEAD_DIM = 128
"""v head dim of DeepSeek V3 MLA."""
QK128_V128 = (128, 128)
"""q/k 128, v 128: the other shape Primus (PR #962, merged) sends to CK on gfx942."""
PRIMUS_QK128 = ("Primus PR #962 sends q/k 128, v 128 to CK on gfx942; aiter's gates and "
                "kernel tables show the ASM kernel is there, so titan-rocm leaves it to aiter "
                "(docs/mla-ck-backward.md)")

LAYOUTS: tuple[str, ...] = ("bshd", "bhsd", "thd")
"""Tensor layouts: batch-mode (either memory order; aiter reads strides) or varlen ``thd``."""
DTYPES: tuple[str, ...] = ("bfloat16", "float16")
"""Element types aiter's flash attention kernels accept."""

CK = "ck"
AITER = "aiter"
FORWARD = "forward"
BACKWARD = "backward"
FUNCTIONS: dict[tuple[str, str, bool], str] = {
    (AITER, FORWARD, False): "_flash_attn_forward",
    (AITER, FORWARD, True): "_flash_attn_varlen_forward",
    (AITER, BACKWARD, False): "_flash_attn_backward",
    (AITER, BACKWARD, True): "_flash_attn_varlen_backward",
    (CK, FORWARD, False): "mha_fwd",
    (CK, FORWARD, True): "mha_varlen_fwd",
    (CK, BACKWARD, False): "mha_bwd",
    (CK, BACKWARD, True): "mha_varlen_bwd",
}
"""The aiter function titan-rocm calls, by (backend, direction, varlen)."""
AITERS_CHOICE = "aiter's choice"
"""The kernel of a call titan-rocm does not reason about."""


@dataclass(frozen=True)
class AttentionCall:
    """What the routing looks at for one attention call; ValueError names a field it cannot reason
    about."""

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
    causal: bool = True
    deterministic: bool = False
    aiter_gfx: str | None = None
    """What aiter's ``get_gfx()`` answers; None: not known, taken to be :attr:`arch`."""
    aiter_version: str | None = None
    """The installed aiter's version; None: not known."""
    aiter_markers: frozenset[str] = frozenset()
    """The aiter changes whose markers the installed aiter's files hold (e.g. ``#4875``;
    :func:`.aiter_releases.installed_markers`); any iterable of their names."""

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
        markers = frozenset(self.aiter_markers)
        unknown = sorted(markers - set(marker_names()))
        if unknown:
            raise ValueError(
                f"aiter_markers = {', '.join(unknown)} is not valid; accepted: "
                f"{', '.join(marker_names())}"
            )
        object.__setattr__(self, "aiter_markers", markers)
        for name in ("arch", "aiter_gfx"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, normalize_arch(value))

    @property
    def varlen(self) -> bool:
        """Packed variable-length (``thd``) tensors with ``cu_seqlens``."""
        return self.layout == "thd"

    @property
    def mla(self) -> bool:
        """DeepSeek MLA's q/k 192, v 128."""
        return self.hdim_q == MLA_QK_HEAD_DIM and self.hdim_v == MLA_V_HEAD_DIM

    @property
    def dispatch_gfx(self) -> str | None:
        """The arch aiter's Python gates reason about: its ``get_gfx()`` answer."""
        return self.aiter_gfx or self.arch

    @property
    def release(self) -> AiterRelease | None:
        """The per-release facts of the installed aiter; None when its version is unknown."""
        return release_for(self.aiter_version, self.aiter_markers)

    @property
    def shape(self) -> str:
        """``q/k 192, v 128``."""
        return f"q/k {self.hdim_q}, v {self.hdim_v}"


@dataclass(frozen=True)
class Route:
    """The decision: ``backend`` (``ck`` or ``aiter``), the aiter ``function`` titan-rocm
    calls, the ``kernel`` that runs in the end, and ``reason``: why."""

    backend: str
    function: str
    kernel: str
    reason: str
    contiguous: bool = False
    """Hand aiter contiguous tensors (and contiguous gradients to fill): the gate of the
    kernel named reads ``is_contiguous()`` (aiter itself fixes only a last-dim stride)."""

    @property
    def label(self) -> str:
        """E.g. ``ck (mha_bwd)`` or ``aiter (_flash_attn_forward)``."""
        return f"{self.backend} ({self.function})"


def _route(call: AttentionCall, direction: str, backend: str, kernel: str, why: str,
           contiguous: bool = False) -> Route:
    return Route(backend, FUNCTIONS[(backend, direction, call.varlen)], kernel, why, contiguous)


def _ck(call: AttentionCall, direction: str) -> str:
    return FUNCTIONS[(CK, direction, call.varlen)]


def _unrouted(call: AttentionCall, direction: str) -> Route | None:
    if call.arch is None:
        return _route(call, direction, AITER, AITERS_CHOICE,
                      "not an AMD GPU (no gfx arch): nothing to route")
    if not call.mla:
        return _route(call, direction, AITER, AITERS_CHOICE,
                      f"{call.shape} is not DeepSeek MLA's q/k 192, v 128; aiter's own "
                      "dispatch handles it")
    return None


def _v3_flags_ok(call: AttentionCall) -> bool:
    # Every fmha_v3 gate read (0.1.7, main) requires these; CK implements all of them.
    return call.dropout_p == 0.0 and not call.has_bias and not call.has_alibi


def route_backward(call: AttentionCall) -> Route:
    """Route one attention backward to aiter's CK kernel or to aiter's own dispatch."""
    if call.arch is not None and (call.hdim_q, call.hdim_v) == QK128_V128:
        return _qk128_backward(call)
    unrouted = _unrouted(call, BACKWARD)
    if unrouted is not None:
        return unrouted
    flydsl = _flydsl_varlen_backward(call)
    if flydsl is not None:
        return flydsl
    facts = ARCHS.get(call.arch or "")
    if facts is not None and facts.aiter_fmha_v3_bwd_qk192_v128:
        kernel, why = _aiter_backward_choice(call)
        return _route(call, BACKWARD, AITER, kernel, why)
    ck = _ck(call, BACKWARD)
    if facts is None:
        where = f"{call.arch} is not an architecture titan-rocm knows; CK is aiter's generic path"
    else:
        where = f"aiter has no fmha_v3 backward kernel for q/k 192, v 128 on {call.arch}"
    return _route(call, BACKWARD, CK, f"CK {ck}", f"{where}; {_aiters_own_backward(call)}")


def _qk128_backward(call: AttentionCall) -> Route:
    """q/k 128, v 128: always aiter's own dispatch (its gates for this shape are the same in
    0.1.7.post2 and main e4048607); the kernel it picks, and why."""
    ck = _ck(call, BACKWARD)
    facts = ARCHS.get(call.arch or "")
    told = ARCHS.get(call.dispatch_gfx or "")
    if facts is None or not facts.aiter_fmha_v3_bwd_qk128_v128:
        return _route(call, BACKWARD, AITER, AITERS_CHOICE,
                      f"titan-rocm knows of no fmha_v3 q/k 128, v 128 backward on {call.arch}; "
                      "aiter's own dispatch chooses")
    if told is None or not told.aiter_fmha_v3_bwd_qk128_v128:
        return _route(call, BACKWARD, AITER, f"CK {ck}",
                      f"aiter's get_gfx() answers {call.dispatch_gfx} on this {call.arch}: its "
                      f"fmha_v3 gates refuse q/k 128 there, so aiter runs CK {ck}")
    if call.dropout_p != 0.0 or call.has_alibi or (call.has_bias and not call.varlen):
        # The varlen gates do not read bias (commented out in both releases).
        return _route(call, BACKWARD, AITER, f"CK {ck}",
                      "aiter's fmha_v3 backward gates refuse dropout, bias and alibi: aiter "
                      f"runs CK {ck}")
    if call.deterministic:
        return _route(call, BACKWARD, AITER, AITERS_CHOICE,
                      "deterministic: aiter's gfx942 gate refuses it (CK), gfx950's takes it "
                      "only for one key block (seqlen_k <= 256, batch mode)")
    kernel = ("fmha_v3_varlen_bwd (ASM)" if call.varlen
              else "fmha_v3_bwd (ASM) for seqlen_q > 16, else CK mha_bwd")
    why = (f"{call.arch}'s fmha_v3 backward has q/k 128, v 128 kernels and aiter's gate "
           f"(get_gfx() answers {call.dispatch_gfx}) takes this call")
    return _route(call, BACKWARD, AITER, kernel, f"{why}; {PRIMUS_QK128}")


def _flydsl_takes(call: AttentionCall) -> bool:
    # What can_impl_fmha_bwd_flydsl (#4875) reads that a call carries. titan-rocm's varlen op
    # meets the rest: one cu_seqlens tensor for q and k, equal maximum lengths and head
    # counts, no window, sink or padded cu_seqlens. Bias is no varlen parameter.
    return (call.varlen and call.causal and call.dtype == "bfloat16" and call.dropout_p == 0.0
            and not call.has_alibi)


def _flydsl_varlen_backward(call: AttentionCall) -> Route | None:
    """The route of a varlen backward that the installed aiter's FlyDSL gate (#4875) takes;
    None where it does not (the other routes say why)."""
    release = call.release
    if release is None or call.dispatch_gfx not in release.varlen_bwd_flydsl_gate:
        return None
    if not _flydsl_takes(call):
        return None
    kernels = ", ".join(sorted(release.varlen_bwd_flydsl_kernels))
    if call.arch in release.varlen_bwd_flydsl_kernels:
        return _route(call, BACKWARD, AITER, "flydsl_flash_attn_varlen_bwd (FlyDSL)", (
            f"aiter {release.name}'s varlen backward gate (can_impl_fmha_bwd_flydsl, ROCm/aiter "
            f"#4875) sends causal bf16 q/k 192, v 128 self-attention on {call.arch} to its FlyDSL "
            f"kernel, which upstream validated on {kernels} against an fp32 reference: "
            "titan-rocm leaves the call to aiter, with the contiguous tensors the gate requires"
        ), contiguous=True)
    ck = _ck(call, BACKWARD)
    return _route(call, BACKWARD, CK, f"CK {ck}", (
        f"aiter's get_gfx() answers {call.dispatch_gfx} on this {call.arch}: aiter "
        f"{release.name}'s varlen backward gate would run its FlyDSL kernel, written and "
        f"validated for {kernels} only; CK {ck}, which aiter runs when get_gfx() answers "
        f"{call.arch}, computes it"))


def _varlen_gates(call: AttentionCall) -> str:
    """Why aiter's varlen backward gates leave q/k 192, v 128 to CK (this release, this call)."""
    release = call.release
    if release is None or not release.varlen_bwd_flydsl_gate:
        return "aiter's varlen gate needs equal q/k and v head dims on every arch"
    if call.dispatch_gfx not in release.varlen_bwd_flydsl_gate:
        gate = ", ".join(sorted(release.varlen_bwd_flydsl_gate))
        when = f"only when get_gfx() answers {gate} (here {call.dispatch_gfx})"
    else:
        when = "only causal bf16 calls without dropout or alibi"
    return (f"aiter's fmha_v3 varlen gates need equal q/k and v head dims on every arch, and aiter "
            f"{release.name}'s FlyDSL gate takes q/k 192, v 128 {when}")


def _aiters_own_backward(call: AttentionCall) -> str:
    """What aiter's own backward dispatch would do with this call (arch without the kernel)."""
    ck = _ck(call, BACKWARD)
    if call.varlen:
        return f"{_varlen_gates(call)}, so it runs CK {ck} too"
    gfx, release = call.dispatch_gfx, call.release
    told_facts = ARCHS.get(gfx or "")
    if told_facts is None or not told_facts.aiter_fmha_v3_bwd_qk192_v128:
        # aiter's gate for the arch it is told has no such kernel to send the call to (only
        # gfx950's has: archs.py).
        return (f"aiter's own gates pick CK {ck} too when get_gfx() answers {gfx}; calling it "
                "directly keeps a mis-detected get_gfx() from sending it to fmha_v3_bwd")
    told = f"aiter's get_gfx() answers {gfx} on this {call.arch}"
    if release is None:
        return f"{told}: its {gfx} gate may send this call to fmha_v3_bwd, which {call.arch} lacks"
    if call.causal and not release.bwd_v3_qk192_v128_causal_on_gfx950:
        return (f"{told}, but aiter {release.name}'s {gfx} gate takes this shape only without "
                f"a causal mask, so it would run CK {ck} as well")
    return (f"{told}: aiter {release.name} would send this call to fmha_v3_bwd, which {call.arch} "
            "lacks ('invalid argument for fmha_v3_bwd')")


def _aiter_backward_choice(call: AttentionCall) -> tuple[str, str]:
    """(kernel, reason) of aiter's own backward on an arch with the q/k 192, v 128 kernel."""
    ck = _ck(call, BACKWARD)
    gfx, release = call.dispatch_gfx, call.release
    if call.varlen:
        return (f"CK {ck}", f"{call.arch}'s fmha_v3 varlen backward has no q/k 192, v 128 kernel "
                f"and {_varlen_gates(call)}: aiter runs CK {ck} itself")
    if gfx != call.arch:
        return (f"CK {ck}", f"aiter's get_gfx() answers {gfx} on this {call.arch}: its gates pick "
                f"CK {ck} (slower than {call.arch}'s fmha_v3 kernel, still correct)")
    if release is None:
        return (AITERS_CHOICE, f"{call.arch}'s fmha_v3 backward has q/k 192, v 128 kernels; "
                "aiter's own dispatch chooses (installed aiter version unknown)")
    if not _v3_flags_ok(call) or call.deterministic:
        return (f"CK {ck}", "aiter's fmha_v3 backward gate refuses dropout, bias, alibi and "
                f"deterministic: aiter runs CK {ck}")
    if call.causal and not release.bwd_v3_qk192_v128_causal_on_gfx950:
        return (f"CK {ck}", f"aiter {release.name}'s {call.arch} gate takes q/k 192, v 128 only "
                f"without a causal mask: aiter runs CK {ck} for this causal call")
    return ("fmha_v3_bwd (ASM) for seqlen_q > 16, else CK mha_bwd",
            f"{call.arch}'s fmha_v3 backward has q/k 192, v 128 kernels and aiter "
            f"{release.name}'s gate takes this call")


def route_forward(call: AttentionCall) -> Route:
    """Route one attention forward to aiter's CK kernel or to aiter's own dispatch."""
    unrouted = _unrouted(call, FORWARD)
    if unrouted is not None:
        return unrouted
    ck = _ck(call, FORWARD)
    v3 = "fmha_v3_varlen_fwd" if call.varlen else "fmha_v3_fwd"
    when = "" if call.varlen else " for seqlen_q > 128"
    gfx, release = call.dispatch_gfx, call.release
    if release is None:
        if gfx != call.arch:
            return _route(call, FORWARD, CK, f"CK {ck}", (
                f"aiter's get_gfx() answers {gfx} on this {call.arch} and the installed aiter "
                f"version is unknown: its forward gate might pick a {v3} kernel {call.arch} "
                f"lacks; CK {ck} runs on every arch"))
        return _route(call, FORWARD, AITER, AITERS_CHOICE,
                      "aiter's own dispatch chooses (installed aiter version unknown)")
    gate = release.fwd_v3_qk192_gate
    admits = _v3_flags_ok(call) and call.dtype == "bfloat16" and (gate is None or gfx in gate)
    has_kernel = call.arch in release.fwd_v3_qk192_kernels
    if admits and not has_kernel:
        return _route(call, FORWARD, CK, f"CK {ck}", (
            f"aiter {release.name}'s forward gate, told {gfx} by get_gfx(), would pick {v3}{when}, "
            f"which has no q/k 192, v 128 kernel for {call.arch} in that release ('invalid "
            f"argument'); CK {ck} computes it"))
    if admits:
        kernel = f"{v3} (ASM){when}" + ("" if call.varlen else f", else CK {ck}")
        why = f"{call.arch} has q/k 192, v 128 {v3} kernels in aiter {release.name}"
        if gfx != call.arch:
            why += f" (get_gfx() answers {gfx}; the kernel runs by the real arch)"
        return _route(call, FORWARD, AITER, kernel, why)
    if not (_v3_flags_ok(call) and call.dtype == "bfloat16"):
        why = f"aiter's fmha_v3 forward needs bf16 without dropout, bias or alibi: it runs CK {ck}"
    else:
        told = ", ".join(sorted(gate or ()))
        why = (f"aiter {release.name}'s forward gate takes q/k 192 only when get_gfx() answers "
               f"{told}: it runs CK {ck}")
    return _route(call, FORWARD, AITER, f"CK {ck}", why)


FLAG_FIELDS = ("dropout_p", "has_bias", "has_alibi", "layout", "dtype", "causal",
               "deterministic")
"""The non-shape inputs of an :class:`AttentionCall` that a route-table row varies."""
Flags = make_dataclass(
    "Flags", [(f.name, f.type, field(default=f.default))
              for f in fields(AttentionCall) if f.name in FLAG_FIELDS], frozen=True)
Flags.__module__ = __name__
Flags.__doc__ = """The non-shape inputs of one route-table row: :data:`FLAG_FIELDS` of
:class:`AttentionCall`, with its defaults (made from its fields: one list of them)."""


DEFAULT_TABLE_ARCHS: tuple[str | None, ...] = ("gfx942", "gfx950")
"""Architectures of the documented route table."""
DEFAULT_TABLE_AITERS: tuple[str, ...] = tuple(SIMULATED_AITERS)
"""``--aiter`` choices of the documented route table: the PyPI wheel, aiter main at e4048607,
the newest aiter main read (with #4875)."""
DEFAULT_TABLE_FLAGS: tuple[Flags, ...] = (Flags(), Flags(layout="thd"))
"""Dense (``bshd``) and varlen (``thd``) causal bf16 calls."""


def arch_label(arch: str | None) -> str:
    """How an architecture is named in route tables (``cuda`` for None)."""
    return "cuda" if arch is None else normalize_arch(arch)


def route_row(call: AttentionCall) -> dict[str, Any]:
    """One JSON-able route-table row: both directions of ``call``."""
    forward, backward = route_forward(call), route_backward(call)
    release = call.release
    return {
        "aiter": call.aiter_version or "unknown",
        "aiter_markers": sorted(call.aiter_markers),
        "aiter_release": release.name if release else None,
        "arch": arch_label(call.arch),
        "aiter_gfx": call.dispatch_gfx,
        "shape": {"qk": call.hdim_q, "v": call.hdim_v},
        "layout": call.layout,
        "forward": forward.label,
        "forward_kernel": forward.kernel,
        "forward_reason": forward.reason,
        "backward": backward.label,
        "backward_kernel": backward.kernel,
        "backward_reason": backward.reason,
    }


def route_table(
    archs: Iterable[str | None] = DEFAULT_TABLE_ARCHS,
    shapes: Iterable[tuple[int, int]] = ((MLA_QK_HEAD_DIM, MLA_V_HEAD_DIM),),
    flags: Sequence[Flags] = DEFAULT_TABLE_FLAGS,
    aiters: Sequence[str] = DEFAULT_TABLE_AITERS,
    aiter_gfx: str | None = None,
) -> list[dict[str, Any]]:
    """One :func:`route_row` per (``--aiter`` choice, arch, shape, flags); ValueError for an unknown
    ``aiters`` entry."""
    rows: list[dict[str, Any]] = []
    for choice in aiters:
        if choice not in SIMULATED_AITERS:
            raise ValueError(f"aiter = {choice!r} is not valid; accepted: "
                             f"{', '.join(SIMULATED_AITERS)}")
        version, markers = SIMULATED_AITERS[choice].version, SIMULATED_MARKERS[choice]
        for arch in archs:
            for qk, v in shapes:
                for f in flags:
                    call = AttentionCall(arch, qk, qk, v, **asdict(f), aiter_gfx=aiter_gfx,
                                         aiter_version=version, aiter_markers=markers)
                    rows.append(route_row(call))
    return rows


def format_route_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of :func:`route_table` rows."""
    lines = [
        "| aiter | arch | attention | forward | forward runs | backward | backward runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        attention = "varlen" if row["layout"] == "thd" else "dense"
        lines.append(
            f"| {row['aiter']} | {row['arch']} | {attention} | {row['forward']} | "
            f"{row['forward_kernel']} | {row['backward']} | {row['backward_kernel']} |"
        )
    return "\n".join(lines)
