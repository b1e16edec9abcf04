"""What both fake aiter generations share: the pretend device, kernel tables, reference kernels,
and aiter's wrapper shapes (``torch_compile_guard``, ``compile_ops``).

The wrapper shapes follow aiter's ``aiter/jit/utils/torch_guard.py`` and ``aiter/jit/core.py``
(0.1.7.post2 and main e4048607): a decorated function becomes a ``(*args, **kwargs)`` wrapper
that calls ``torch.ops.aiter.<name>``, an op defined from the function's signature (all tensor
arguments marked as mutated unless ``mutates_args`` names them) and implemented for CPU and
CUDA. So a
caller sees no Python signature and must read the op's schema, as with the real aiter. The ops
live in one ``torch.library.Library``; :func:`destroy` removes them, so that the other generation
can define the same names with its own parameter lists.

Kernel tables (which fmha_v3 ASM kernels exist, per generation and *real* arch) are copied from
aiter's ``hsa/<gfx>/fmha_v3_{fwd,bwd}/`` listings: the PyPI wheel 0.1.7.post2.dev18
(``aiter_meta/hsa``) and main e4048607 (``fmha_fwd.csv``, ``fmha_bwd_dqdkdv.csv``). An
fmha_v3 kernel asked for a shape its real arch lacks raises the message of aiter's C++ check
(``csrc/py_itfs_cu/asm_mha_*.cu``). The math is an fp32 reference attention, per segment for
varlen.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import types
import typing
from typing import Any

import torch

DEVICE_ARCH = "gfx942"
"""gcnArchName target of the pretend device: the arch the kernels really run on."""

CALLS: list[tuple[str, dict[str, Any]]] = []
"""(kernel name, details) for every kernel-level call, in order."""

FLYDSL_AVAILABLE = True
"""What aiter main's ``is_flydsl_available()`` answers (the ``flydsl`` package installed, with
kernels for the device); :func:`reset` sets it back to True."""

_LIBRARY: torch.library.Library | None = None


def record(name: str, **details: Any) -> None:
    CALLS.append((name, details))


def names() -> list[str]:
    """The kernel names called so far."""
    return [name for name, _ in CALLS]


def reset(device_arch: str = "gfx942") -> None:
    """Forget recorded calls, set the pretend device arch, FlyDSL installed."""
    global DEVICE_ARCH, FLYDSL_AVAILABLE
    CALLS.clear()
    DEVICE_ARCH = device_arch
    FLYDSL_AVAILABLE = True


def destroy() -> None:
    """Remove every ``torch.ops.aiter`` op the fake defined (tests, between generations)."""
    global _LIBRARY
    if _LIBRARY is not None:
        _LIBRARY._destroy()
        _LIBRARY = None


# ---- aiter's wrapper shapes ----------------------------------------------------------------


def _schema_type(annotation: Any, mutated: bool, index: int) -> str:
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional, annotation = True, args[0]
    alias = f"(a{index}!)" if mutated else ""
    names = {torch.Tensor: f"Tensor{alias}", int: "SymInt", float: "float", bool: "bool",
             str: "str", torch.Generator: "Generator"}
    return names[annotation] + ("?" if optional else "")


def schema_of(func: Any, mutates_args: Any) -> str:
    """The op schema aiter would register for ``func`` (``"unknown"``: every tensor mutated)."""
    hints = typing.get_type_hints(func)
    params = []
    for index, (name, param) in enumerate(inspect.signature(func).parameters.items()):
        mutated = mutates_args == "unknown" or name in mutates_args
        text = f"{_schema_type(hints[name], mutated, index)} {name}"
        if param.default is not inspect.Parameter.empty:
            text += f"={param.default}"
        params.append(text)
    ret = hints["return"]
    if typing.get_origin(ret) is tuple:
        out = "(" + ", ".join("Tensor" for _ in typing.get_args(ret)) + ")"
    else:
        out = "Tensor"
    return f"({', '.join(params)}) -> {out}"


def torch_compile_guard(mutates_args: Any = "unknown", device: str = "cpu",
                        calling_func_: Any = None, gen_fake: Any = None):
    """aiter's decorator: define ``torch.ops.aiter.<name>`` and return a ``(*args, **kwargs)``
    wrapper around it (no Python signature left to read)."""

    def decorator(func):
        target = calling_func_ or func
        name = target.__name__
        signature = inspect.signature(target)

        def impl(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return func(**bound.arguments)

        global _LIBRARY
        if _LIBRARY is None:
            _LIBRARY = torch.library.Library("aiter", "FRAGMENT")
        if not hasattr(torch.ops.aiter, name):
            _LIBRARY.define(name + schema_of(target, mutates_args))
            for key in ("CPU", "CUDA"):  # as aiter registers them
                _LIBRARY.impl(name, impl, key)
            if gen_fake is not None:
                _LIBRARY._register_fake(name, gen_fake)

        def wrapper(*args, **kwargs):
            return getattr(torch.ops.aiter, name)(*args, **kwargs)

        return wrapper

    return decorator


def compile_ops(kernel: Any, gen_fake: Any = None):
    """aiter's ``@compile_ops`` for one kernel: the declared signature (a body-less function, as
    in aiter) is bound to ``kernel(name, **arguments)`` behind ``torch_compile_guard``."""

    def decorator(declaration):
        @functools.wraps(declaration)
        def run(**arguments):
            return kernel(declaration.__name__, **arguments)

        return torch_compile_guard(calling_func_=declaration, gen_fake=gen_fake)(run)

    return decorator


# ---- dispatch pieces both releases share (aiter/ops/mha.py, 0.1.7.post2 and e4048607) ----


def get_gfx() -> str:
    """The imported generation's (cached) ``get_gfx()``."""
    return sys.modules["aiter.jit.utils.chip_info"].get_gfx()


def maybe_contiguous(x):
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


def sliding_window(left: int, right: int) -> bool:
    return left > 0 or right > 0


def can_impl_fmha_v3_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dk: torch.Tensor | None,
    dv: torch.Tensor | None,
    dbias: torch.Tensor | None,
    dropout_p: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    bias: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    deterministic: bool,
    is_v3_atomic_fp32: bool | None = True,
) -> bool:
    """aiter's gfx942 batch-mode backward gate, the same in both generations: 0.1.7.post2's
    ``aiter/ops/mha.py`` lines 1265-1441 and main e4048607's lines 2125-2300 (``psskddv`` at
    1406 / 2265 takes q/k 128 = v 128 with fp32 atomics, causal or no mask)."""
    _, seqlen_q, nhead_q, hdim_q = q.shape
    _, seqlen_k, nhead_k, hdim_v = v.shape
    left = -1 if window_size_left >= seqlen_k else window_size_left
    right = -1 if window_size_right >= seqlen_k else window_size_right
    swa = sliding_window(left, right)
    mask = causal and left == -1
    nmask = not causal and left == -1 and right == -1
    square = seqlen_q == seqlen_k and seqlen_k % 64 == 0
    np_case = (hdim_q == 128 or (hdim_q == 64 and not is_v3_atomic_fp32)) and square
    pssk = hdim_q == 64 and bool(is_v3_atomic_fp32) and not swa
    pddv = not is_v3_atomic_fp32 and 64 < hdim_q < 128 and square and not swa
    psskddv = (bool(is_v3_atomic_fp32) and 64 < hdim_q <= 192
               and (nmask or mask or (swa and hdim_q <= 128)))
    return bool(
        get_gfx() == "gfx942" and alibi_slopes is None and bias is None and dbias is None
        and dropout_p == 0.0 and not deterministic and hdim_q == hdim_v
        and nhead_q % nhead_k == 0 and 64 <= hdim_q <= 192 and hdim_q % 8 == 0
        and ((np_case and not swa) or pssk or pddv or psskddv)
    )


def varlen_v3_backward(q, v, dropout_p: float, deterministic: bool, alibi_slopes, left: int,
                       right: int, is_v3_atomic_fp32) -> bool:
    """``_flash_attn_varlen_backward``'s two gates (gfx942, gfx950): equal head dims on both."""
    nhead_q, hdim_q = q.shape[-2], q.shape[-1]
    nhead_k, hdim_v = v.shape[-2], v.shape[-1]
    common = (alibi_slopes is None and dropout_p == 0.0 and not deterministic
              and hdim_q == hdim_v and nhead_q % nhead_k == 0 and hdim_q % 8 == 0
              and not sliding_window(left, right))
    gfx942 = get_gfx() == "gfx942" and common and 64 <= hdim_q <= 192 and bool(is_v3_atomic_fp32)
    return gfx942 or (get_gfx() == "gfx950" and common and 64 < hdim_q <= 128)


# ---- kernel tables: which fmha_v3 ASM kernels exist, by generation and real arch ------------

V3_FORWARD = {  # (hdim_q, hdim_v), batch and group (varlen) alike
    "0.1.7": {"gfx942": {(128, 128)}, "gfx950": {(128, 128), (192, 128)}},
    "main": {"gfx942": {(128, 128), (192, 128)}, "gfx950": {(128, 128), (192, 128)}},
}
V3_BACKWARD = {  # batch mode
    "0.1.7": {"gfx942": {(64, 64), (128, 128), (192, 192)},
              "gfx950": {(64, 64), (128, 128), (192, 128), (192, 192)}},
    "main": {"gfx942": {(64, 64), (128, 128), (192, 192)},
             "gfx950": {(64, 64), (128, 128), (192, 128), (192, 192)}},
}
V3_VARLEN_BACKWARD = {  # group mode: no q/k 192, v 128 kernel anywhere
    "0.1.7": {"gfx942": {(64, 64), (128, 128), (192, 192)}, "gfx950": {(128, 128), (192, 192)}},
    "main": {"gfx942": {(64, 64), (128, 128), (192, 192)}, "gfx950": {(128, 128), (192, 192)}},
}
FAILURE = {  # aiter's C++ TORCH_CHECK message when no kernel matches
    ("0.1.7", "fmha_v3_fwd"): "invalid argument for fmha_fwd",
    ("0.1.7", "fmha_v3_varlen_fwd"): "invalid argument for fmha_v3_varlen_fwd 3",
    ("main", "fmha_v3_fwd"): "invalid argument for fmha_fwd",
    ("main", "fmha_v3_varlen_fwd"): "invalid argument for fmha_v3_varlen_fwd",
}


def make_kernel(generation: str):
    """The kernel body behind every ``@compile_ops`` declaration of one generation."""

    def kernel(name: str, **a: Any):
        hq, hv = a["q"].shape[-1], a["v"].shape[-1]
        common = {"dropout_p": a["dropout_p"], "softmax_scale": a["softmax_scale"],
                  "is_causal": a["is_causal"], "alibi_slopes": a.get("alibi_slopes")}
        if name in ("mha_fwd", "fmha_v3_fwd"):
            if name == "fmha_v3_fwd":
                require_v3(generation, name, V3_FORWARD, hq, hv)
            return forward_kernel(name, a["q"], a["k"], a["v"], out=a.get("out"),
                                  bias=a.get("bias"), return_lse=a["return_softmax_lse"],
                                  **common)
        if name in ("mha_varlen_fwd", "fmha_v3_varlen_fwd"):
            if name == "fmha_v3_varlen_fwd":
                require_v3(generation, name, V3_FORWARD, hq, hv)
            cu_k = a["cu_seqlens_k"] if a["cu_seqlens_k"] is not None else a["cu_seqlens_q"]
            return varlen_forward_kernel(name, a["q"], a["k"], a["v"], a["cu_seqlens_q"], cu_k,
                                         out=a.get("out"), bias=a.get("bias"),
                                         return_lse=a["return_softmax_lse"],
                                         max_seqlen_q=a["max_seqlen_q"], **common)
        grads = {"dq": a.get("dq"), "dk": a.get("dk"), "dv": a.get("dv")}
        if name in ("mha_bwd", "fmha_v3_bwd"):
            if name == "fmha_v3_bwd":
                require_v3(generation, name, V3_BACKWARD, hq, hv)
            return backward_kernel(name, a["dout"], a["q"], a["k"], a["v"], a["out"],
                                   bias=a.get("bias"), deterministic=a["deterministic"],
                                   **grads, **common)
        if name == "fmha_v3_varlen_bwd":
            require_v3(generation, name, V3_VARLEN_BACKWARD, hq, hv)
        return varlen_backward_kernel(name, a["dout"], a["q"], a["k"], a["v"], a["out"],
                                      a["cu_seqlens_q"], a["cu_seqlens_k"],
                                      max_seqlen_q=a["max_seqlen_q"],
                                      deterministic=a["deterministic"], **grads, **common)

    return kernel


def gfx_from_env() -> str:
    """aiter's ``get_gfx()`` before caching: the last ``GPU_ARCHS`` entry, else (unset or
    ``native``) the first GPU rocminfo lists, here the pretend device."""
    value = os.environ.get("GPU_ARCHS", "native")
    return DEVICE_ARCH if value == "native" else value.split(";")[-1]


def require_v3(generation: str, kernel: str, table: dict, hdim_q: int, hdim_v: int) -> None:
    """Raise as aiter's C++ side does when the real arch has no such fmha_v3 kernel."""
    if (hdim_q, hdim_v) not in table[generation].get(DEVICE_ARCH, set()):
        record(f"{kernel}:failed", hdim_q=hdim_q, hdim_v=hdim_v, arch=DEVICE_ARCH)
        raise RuntimeError(FAILURE.get((generation, kernel), f"invalid argument for {kernel}"))


# ---- reference math (fp32) -------------------------------------------------------------------


def _scores(q, k, softmax_scale, causal):
    # q: (b, sq, hq, d), k: (b, sk, hk, d) -> (b, hq, sq, sk), bottom-right causal mask.
    qf, kf = q.float().transpose(1, 2), k.float().transpose(1, 2)
    if qf.shape[1] != kf.shape[1]:
        kf = kf.repeat_interleave(qf.shape[1] // kf.shape[1], dim=1)
    s = qf @ kf.transpose(-1, -2) * softmax_scale
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        i = torch.arange(sq, device=s.device).unsqueeze(1)
        j = torch.arange(sk, device=s.device).unsqueeze(0)
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    return s


def attend(q, k, v, softmax_scale, causal):
    """bshd attention: (out fp32 bshd, lse (b, h, sq))."""
    s = _scores(q, k, softmax_scale, causal)
    vf = v.float().transpose(1, 2)
    if vf.shape[1] != s.shape[1]:
        vf = vf.repeat_interleave(s.shape[1] // vf.shape[1], dim=1)
    lse = torch.logsumexp(s, dim=-1).contiguous()
    return (torch.softmax(s, dim=-1) @ vf).transpose(1, 2), lse


def attend_backward(dout, q, k, v, softmax_scale, causal):
    """Closed-form bshd attention gradients (kernels run below autograd)."""
    s = _scores(q, k, softmax_scale, causal)
    heads, heads_k = s.shape[1], k.shape[2]
    rep = heads // heads_k
    p = torch.softmax(s, dim=-1)
    do = dout.float().transpose(1, 2)
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    dv = p.transpose(-1, -2) @ do
    dp = do @ vf.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    dq = ds @ kf * softmax_scale
    dk = ds.transpose(-1, -2) @ qf * softmax_scale

    def fold(t):  # sum the q heads that share a k/v head
        b, _, sl, d = t.shape
        return t.view(b, heads_k, rep, sl, d).sum(2).transpose(1, 2)

    return dq.transpose(1, 2), fold(dk), fold(dv)


def _segments(cu_seqlens):
    bounds = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _check(dropout_p, bias=None, alibi_slopes=None):
    if dropout_p != 0.0:
        raise NotImplementedError("fake aiter: dropout is not modelled")
    if bias is not None or alibi_slopes is not None:
        raise NotImplementedError("fake aiter: bias/alibi are not modelled")


def forward_kernel(name, q, k, v, dropout_p, softmax_scale, is_causal, out=None, bias=None,
                   alibi_slopes=None, return_lse=True, **details):
    """A dense forward kernel: (out, lse, p, rng_state) as aiter's ``mha_fwd`` returns them."""
    _check(dropout_p, bias, alibi_slopes)
    record(name, q_shape=tuple(q.shape), v_shape=tuple(v.shape), dtype=q.dtype,
           causal=is_causal, softmax_scale=softmax_scale, **details)
    ref, lse = attend(q, k, v, softmax_scale, is_causal)
    result = ref.to(q.dtype).contiguous()  # aiter allocates a dense bshd output
    if out is not None:
        out.copy_(result)
        result = out
    if not return_lse:
        lse = torch.empty((0,), dtype=torch.float32, device=q.device)
    return (result, lse, torch.empty((0,), device=q.device),
            torch.zeros((2,), dtype=torch.int64, device=q.device))


def backward_kernel(name, dout, q, k, v, out, softmax_scale, is_causal, dropout_p, dq=None,
                    dk=None, dv=None, bias=None, alibi_slopes=None, **details):
    """A dense backward kernel writing ``dq``/``dk``/``dv``: (dq, dk, dv, softmax_d)."""
    _check(dropout_p, bias, alibi_slopes)
    record(name, q_shape=tuple(q.shape), k_shape=tuple(k.shape), v_shape=tuple(v.shape),
           dout_shape=tuple(dout.shape), dtype=q.dtype, causal=is_causal,
           softmax_scale=softmax_scale, **details)
    grads = attend_backward(dout, q, k, v, softmax_scale, is_causal)
    results = []
    for given, like, grad in zip((dq, dk, dv), (q, k, v), grads, strict=True):
        target = torch.empty_like(like) if given is None else given
        target.copy_(grad)
        results.append(target)
    softmax_d = (dout.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    return (*results, softmax_d)


def varlen_forward_kernel(name, q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, softmax_scale,
                          is_causal, out=None, bias=None, alibi_slopes=None, return_lse=True,
                          **details):
    """A varlen forward kernel on ``thd`` tensors: (out, lse (h, total), p, rng_state)."""
    _check(dropout_p, bias, alibi_slopes)
    segments = _segments(cu_seqlens_q)
    record(name, q_shape=tuple(q.shape), v_shape=tuple(v.shape), dtype=q.dtype,
           causal=is_causal, softmax_scale=softmax_scale, segments=segments,
           k_segments=_segments(cu_seqlens_k), **details)
    result = torch.zeros((q.shape[0], q.shape[1], v.shape[-1]), dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32)
    for (start, end), (k_start, k_end) in zip(segments, _segments(cu_seqlens_k), strict=True):
        o, l_ = attend(q[None, start:end], k[None, k_start:k_end], v[None, k_start:k_end],
                       softmax_scale, is_causal)
        result[start:end] = o[0].to(q.dtype)
        lse[:, start:end] = l_[0]
    if out is not None:
        out.copy_(result)
        result = out
    if not return_lse:
        lse = torch.empty((0,), dtype=torch.float32)
    return (result, lse, torch.empty((0,)), torch.zeros((2,), dtype=torch.int64))


def varlen_backward_kernel(name, dout, q, k, v, out, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                           is_causal, dropout_p, dq=None, dk=None, dv=None, alibi_slopes=None,
                           **details):
    """A varlen backward kernel writing ``dq``/``dk``/``dv``: (dq, dk, dv, softmax_d)."""
    _check(dropout_p, None, alibi_slopes)
    segments = _segments(cu_seqlens_q)
    record(name, q_shape=tuple(q.shape), v_shape=tuple(v.shape), dout_shape=tuple(dout.shape),
           dtype=q.dtype, causal=is_causal, softmax_scale=softmax_scale, segments=segments,
           **details)
    targets = [torch.empty_like(like) if given is None else given
               for given, like in zip((dq, dk, dv), (q, k, v), strict=True)]
    for (start, end), (k_start, k_end) in zip(segments, _segments(cu_seqlens_k), strict=True):
        grads = attend_backward(dout[None, start:end], q[None, start:end],
                                k[None, k_start:k_end], v[None, k_start:k_end],
                                softmax_scale, is_causal)
        for target, grad, (a, b) in zip(targets, grads,
                                        ((start, end), (k_start, k_end), (k_start, k_end)),
                                        strict=True):
            target[a:b] = grad[0].to(target.dtype)
    softmax_d = (dout.float() * out.float()).sum(-1).transpose(0, 1).contiguous()
    return (*targets, softmax_d)
