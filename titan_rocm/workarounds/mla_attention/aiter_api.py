"""Lazy access to aiter's flash-attention functions, across aiter versions.

Nothing here imports aiter at module load. ``import aiter`` fails on machines without
ROCm with RuntimeError/AssertionError from its JIT setup (not ImportError), so
:func:`load_mha` checks the platform first and turns any exception into
:class:`AiterUnavailable`.

aiter's signatures grow between releases (``bias``/``dbias``, then ``sink_size``, fp8
descales, ``sink``/``d_sink``), and ``torch_compile_guard`` hides some of them behind a
``(*args, **kwargs)`` wrapper. Calls here therefore pass keywords, filtered to the
parameters the installed function declares (read from its signature, else from its
``torch.ops.aiter`` schema); a required parameter titan-rocm does not know is an error that
names it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from typing import Any

from titan_rocm import platform
from titan_rocm.platform import PlatformFacts

MHA_MODULE = "aiter.ops.mha"

# Neutral values for parameters some aiter versions require and titan-rocm never uses.
_NEUTRAL: dict[str, Any] = {
    "window_size_left": -1,
    "window_size_right": -1,
    "sink_size": 0,
    "bias": None,
    "dbias": None,
    "alibi_slopes": None,
    "q_descale": None,
    "k_descale": None,
    "v_descale": None,
    "sink": None,
    "d_sink": None,
    "gen": None,
}


# Parameter lists of aiter's functions (2025-2026 releases), used when neither a function's
# Python signature nor its torch.ops schema can be read: the required parameters of
# ``_flash_attn_forward``, and the parameters of the two backwards that titan-rocm fills.
CANONICAL_PARAMETERS: dict[str, tuple[str, ...]] = {
    "_flash_attn_forward": (
        "q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size_left",
        "window_size_right", "sink_size", "bias", "alibi_slopes", "q_descale", "k_descale",
        "v_descale", "return_lse", "return_softmax",
    ),
    "_flash_attn_backward": (
        "dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv", "dbias", "dropout_p",
        "softmax_scale", "causal", "window_size_left", "window_size_right", "bias",
        "alibi_slopes", "deterministic", "rng_state", "is_v3_atomic_fp32", "how_v3_bf16_cvt",
        "sink", "d_sink",
    ),
    "mha_bwd": (
        "dout", "q", "k", "v", "out", "softmax_lse", "dropout_p", "softmax_scale", "is_causal",
        "window_size_left", "window_size_right", "deterministic", "dq", "dk", "dv", "dbias",
        "bias", "alibi_slopes", "rng_state", "gen",
    ),
}


class AiterUnavailable(RuntimeError):
    """aiter cannot be used in this process; the message says what is missing."""


def missing_requirements(facts: PlatformFacts | None = None) -> list[str]:
    """What this machine lacks for aiter flash attention (empty: nothing known missing)."""
    facts = facts or platform.current()
    missing: list[str] = []
    if not facts.is_rocm:
        missing.append("a ROCm build of torch (torch.version.hip is None)")
    if not facts.aiter_spec_found:
        missing.append("the aiter package (pip install amd-aiter, or ROCm/aiter from source)")
    if facts.is_rocm and facts.device_count == 0:
        missing.append("a visible AMD GPU")
    return missing


def unavailable_reason(facts: PlatformFacts | None = None, *, try_import: bool) -> str | None:
    """Why aiter cannot be used, or None.

    With ``try_import``, also imports ``aiter.ops.mha`` — but never on simulated facts
    (``titan-rocm plan --arch``), where aiter must not be imported.
    """
    facts = facts or platform.current()
    missing = missing_requirements(facts)
    if missing:
        return "missing " + "; ".join(missing)
    if try_import and not facts.simulated:
        try:
            load_mha(facts)
        except AiterUnavailable as exc:
            return str(exc)
    return None


def load_mha(facts: PlatformFacts | None = None) -> Any:
    """Import and return ``aiter.ops.mha`` (``facts``: default :func:`platform.current`).

    Raises:
        AiterUnavailable: not a ROCm build, aiter not installed, or its import failed.
    """
    module = sys.modules.get(MHA_MODULE)
    if module is not None:
        return module
    if not (facts or platform.current()).is_rocm:
        raise AiterUnavailable("aiter needs a ROCm build of torch (torch.version.hip is None)")
    if importlib.util.find_spec("aiter") is None:
        raise AiterUnavailable("the aiter package is not installed (pip install amd-aiter)")
    try:
        return importlib.import_module(MHA_MODULE)
    except Exception as exc:  # aiter's JIT setup raises RuntimeError/AssertionError
        raise AiterUnavailable(
            f"import {MHA_MODULE} failed: {type(exc).__name__}: {exc}"
        ) from exc


def parameters(fn: Callable[..., Any], op_name: str) -> list[tuple[str, bool]] | None:
    """``(name, required)`` for each parameter of aiter function ``fn``, or None if unknown.

    Uses the Python signature; for a ``torch_compile_guard`` wrapper (``*args, **kwargs``)
    the schema of ``torch.ops.aiter.<op_name>`` (without its leading dummy tensor).
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        named = [
            (p.name, p.default is inspect.Parameter.empty)
            for p in sig.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if named:
            return named
    try:
        import torch

        packet = getattr(torch.ops.aiter, op_name)
        schema = packet.default._schema
    except Exception:  # no such op, or an older torch without schemas
        return None
    args = list(schema.arguments)
    if args and args[0].name.startswith("dummy"):
        args = args[1:]
    return [(a.name, not a.has_default_value()) for a in args]


def call_with_known(
    fn: Callable[..., Any], op_name: str, values: dict[str, Any]
) -> Any:
    """Call ``fn`` with the keywords from ``values`` (plus neutral defaults) it declares.

    Raises:
        AiterUnavailable: ``fn`` requires a parameter titan-rocm has no value for.
    """
    params = parameters(fn, op_name)
    merged = {**_NEUTRAL, **values}
    if params is None:
        canonical = CANONICAL_PARAMETERS.get(op_name)
        if canonical is None:
            return fn(**values)
        return fn(**{name: merged[name] for name in canonical if name in merged})
    kwargs: dict[str, Any] = {}
    for name, required in params:
        if name in merged:
            kwargs[name] = merged[name]
        elif required:
            raise AiterUnavailable(
                f"aiter's {op_name} requires parameter {name!r}, which titan-rocm does not "
                "know; this aiter version is not supported by rocm.mla_ck_backward"
            )
    return fn(**kwargs)


def _contiguous_last(x: Any) -> Any:
    # aiter's kernels need a unit stride in the last dim only (they read the other strides).
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


def flash_forward(
    q: Any, k: Any, v: Any, dropout_p: float, softmax_scale: float, causal: bool
) -> tuple[Any, Any, Any]:
    """aiter's flash attention forward on ``bshd`` tensors: ``(out, softmax_lse, rng_state)``.

    ``aiter.ops.mha._flash_attn_forward`` is the dispatch that picks aiter's fastest kernel
    (the fmha_v3 ASM forward for q/k 192, v 128 bf16 on gfx942/gfx950), as
    ``aiter.flash_attn_func`` does.
    """
    mha = load_mha()
    q, k, v = (_contiguous_last(t) for t in (q, k, v))
    result = call_with_known(
        mha._flash_attn_forward,
        "_flash_attn_forward",
        {
            "q": q,
            "k": k,
            "v": v,
            "dropout_p": float(dropout_p),
            "softmax_scale": float(softmax_scale),
            "causal": bool(causal),
            "return_lse": True,
            "return_softmax": False,
        },
    )
    out, softmax_lse, _s_dmask, rng_state = result
    if rng_state is None:
        import torch

        rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)
    return out, softmax_lse, rng_state


def ck_backward(values: dict[str, Any]) -> Any:
    """aiter's generic CK backward ``mha_bwd``, writing into ``dq``/``dk``/``dv``.

    ``values`` uses ``_flash_attn_backward``'s parameter names (``causal``, not
    ``is_causal``). Returns ``softmax_d`` as ``_flash_attn_backward`` does.
    """
    mha = load_mha()
    v = dict(values)
    for name in ("dout", "q", "k", "v", "out"):
        v[name] = _contiguous_last(v[name])
    v["is_causal"] = bool(v.pop("causal"))
    for aiter_only in ("is_v3_atomic_fp32", "how_v3_bf16_cvt"):
        v.pop(aiter_only, None)
    dq, dk, dv, softmax_d = call_with_known(mha.mha_bwd, "mha_bwd", v)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        given = values.get(name)
        # torch hands back the caller's Python object for a tensor written in place; a
        # different object means this aiter build allocated its own result.
        if given is not None and got is not given:
            given.copy_(got)
    return softmax_d


def aiter_backward(values: dict[str, Any]) -> Any:
    """aiter's own backward dispatch ``_flash_attn_backward`` (writes ``dq``/``dk``/``dv``)."""
    mha = load_mha()
    return call_with_known(mha._flash_attn_backward, "_flash_attn_backward", values)
