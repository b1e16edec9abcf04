"""Lazy access to aiter's flash-attention functions, across aiter versions.

``import aiter`` fails off ROCm with RuntimeError/AssertionError (not ImportError), so
:func:`load_mha` checks the platform first. aiter's signatures grow between releases and its kernels
are ``(*args, **kwargs)`` wrappers (``aiter/jit/core.py``), so calls pass only the keywords the
installed function declares (read from the op schema or signature)."""

from __future__ import annotations

import functools
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
    "sink_ptr": None,
    "gen": None,
    "out": None,
    "cu_seqlens_q": None,
    "cu_seqlens_kv": None,
    "cu_seqlens_q_padded": None,
    "cu_seqlens_k_padded": None,
    "block_table": None,
    "min_seqlen_q": 0,
    "logits_soft_cap": 0.0,
    "zero_tensors": False,
    "return_softmax": False,
}

CK_KERNELS: frozenset[str] = frozenset({"mha_fwd", "mha_varlen_fwd", "mha_bwd", "mha_varlen_bwd"})
"""aiter's generic CK kernels, which titan-rocm calls directly where the routing says so."""
# The CK kernels name three parameters differently from aiter's Python dispatchers.
_KERNEL_NAMES = {
    "causal": "is_causal",
    "return_lse": "return_softmax_lse",
    "return_softmax": "return_dropout_randval",
}
_DISPATCH_ONLY = ("is_v3_atomic_fp32", "how_v3_bf16_cvt")


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
    """Why aiter cannot be used, or None; ``try_import`` also imports ``aiter.ops.mha`` (never on
    simulated facts)."""
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
    """Import and return ``aiter.ops.mha``; raises AiterUnavailable off ROCm, without aiter, or when
    its import fails."""
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


@functools.cache  # read once per function: every attention forward and backward asks
def parameters(fn: Callable[..., Any], op_name: str) -> list[tuple[str, bool]] | None:
    """``(name, required)`` for each parameter of aiter function ``fn``, or None if unknown (shared:
    never change it); a wrapper is read from the schema of ``torch.ops.aiter.<op_name>``."""
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


def call_with_known(fn: Callable[..., Any], op_name: str, values: dict[str, Any]) -> Any:
    """Call ``fn`` with the keywords of ``values`` (plus neutral defaults) it declares; raises
    AiterUnavailable when it requires one titan-rocm has no value for."""
    params = parameters(fn, op_name)
    if params is None:
        raise AiterUnavailable(
            f"cannot read the parameters of aiter's {op_name} (no Python signature and no "
            f"torch.ops.aiter.{op_name} schema); this aiter version is not supported by "
            "rocm.mla_ck_backward"
        )
    merged = {**_NEUTRAL, **values}
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


def call(function: str, values: dict[str, Any]) -> Any:
    """Call ``aiter.ops.mha.<function>`` with ``values`` named as aiter's Python dispatchers
    name them (``causal``, ``return_lse``); renamed for a CK kernel (``is_causal``, ...)."""
    mha = load_mha()
    named = dict(values)
    for name in ("dout", "q", "k", "v", "out"):
        if name in named:
            named[name] = _contiguous_last(named[name])
    if function in CK_KERNELS:
        for ours, kernels in _KERNEL_NAMES.items():
            if ours in named:
                named[kernels] = named.pop(ours)
        named.setdefault("return_dropout_randval", False)
        for dispatch_only in _DISPATCH_ONLY:
            named.pop(dispatch_only, None)
    return call_with_known(getattr(mha, function), function, named)


def forward(function: str, values: dict[str, Any]) -> tuple[Any, Any, Any]:
    """An aiter forward (dispatcher or CK kernel): ``(out, softmax_lse, rng_state)``."""
    out, softmax_lse, _s_dmask, rng_state = call(
        function, {**values, "return_lse": True, "return_softmax": False}
    )
    if rng_state is None:
        import torch

        rng_state = torch.zeros(2, dtype=torch.int64, device=values["q"].device)
    return out, softmax_lse, rng_state


def backward(function: str, values: dict[str, Any]) -> Any:
    """An aiter backward (dispatcher or CK kernel) writing into ``dq``/``dk``/``dv``; returns
    ``softmax_d`` as aiter's dispatchers do."""
    result = call(function, values)
    if function not in CK_KERNELS:
        return result
    dq, dk, dv, softmax_d = result
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        given = values.get(name)
        # torch hands back the caller's Python object for a tensor written in place; a
        # different object means this aiter build allocated its own result.
        if given is not None and got is not given:
            given.copy_(got)
    return softmax_d
