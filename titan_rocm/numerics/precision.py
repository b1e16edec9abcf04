"""The two replays' precisions: eager at the job's own, and the high-precision reference
(docs/numerics-audit.md, "The reference").

Under FSDP the reference all-gathers the float32 shards instead of re-typing in place (sharded
parameters cannot be), so FSDP's reference is float32 whatever is asked."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from titan_rocm.numerics import fsdp

REFERENCES = ("auto", "float64", "float32", "tf32")


@dataclass(frozen=True)
class Reference:
    """The reference replay's arithmetic."""

    dtype: torch.dtype
    tf32: bool = False

    @property
    def name(self) -> str:
        text = str(self.dtype).removeprefix("torch.")
        return f"{text} (TF32 GEMMs)" if self.tf32 else text


def choose_reference(choice: str, job_dtype: torch.dtype, sharded: bool,
                     device: torch.device) -> tuple[Reference, str | None]:
    """The reference for ``choice``, and a note when the job's layout or device changed what was
    asked."""
    if choice == "auto":
        choice = ("float64" if job_dtype.itemsize >= 4 else
                  "tf32" if job_dtype == torch.bfloat16 else "float32")
    note = None
    if choice == "float64" and (sharded or device.type == "mps"):
        why = "FSDP's sharded parameters cannot be re-typed" if sharded else "MPS has no float64"
        note = f"reference in float32, not float64: {why}"
        choice = "float32"
    if choice == "tf32":
        return Reference(torch.float32, tf32=device.type == "cuda"), note
    return Reference(torch.float64 if choice == "float64" else torch.float32), note


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """cuBLAS/cuDNN TF32 as asked (on ROCm, hipBLASLt's XF32 where the GPU has it), restored."""
    # Written only where it differs: on torch >= 2.9 writing the legacy flag back sets
    # ``fp32_precision`` to "ieee" where it stood at "none" (the same arithmetic, another state).
    flags = [f for f in (torch.backends.cuda.matmul, torch.backends.cudnn)
             if f.allow_tf32 != enabled]
    for f in flags:
        f.allow_tf32 = enabled
    try:
        yield
    finally:
        for f in flags:
            f.allow_tf32 = not enabled


@contextlib.contextmanager
def retyped(modules: list[nn.Module], dtype: torch.dtype,
            exclude: list[nn.Module] = ()) -> Iterator[None]:
    """The floating parameters and buffers of ``modules`` in ``dtype`` (under FSDP, their sharded
    dtype); exactly as before on exit."""
    if fsdp.is_fsdp(modules):
        with fsdp.raised_to_sharded_dtype(modules, exclude):
            yield
        return
    skip = {id(t) for m in exclude for t in [*m.parameters(), *m.buffers()]}
    swapped: list[tuple[torch.Tensor, torch.Tensor]] = []
    complex_dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    try:
        for module in modules:
            for t in [*module.parameters(), *module.buffers()]:
                if id(t) in skip:
                    continue
                skip.add(id(t))
                target = (dtype if t.is_floating_point() else
                          complex_dtype if t.is_complex() else None)
                if target is not None and t.dtype != target:
                    swapped.append((t, t.data))
                    _set_data(t, t.data.to(target))
        yield
    finally:
        for t, data in reversed(swapped):
            if isinstance(t, nn.Parameter):
                t.grad = None
            _set_data(t, data)


def _set_data(t: torch.Tensor, data: torch.Tensor) -> None:
    """On a DTensor ``.data =`` swaps only the wrapper's metadata; this swaps the local shard and
    spec too (torch 2.13-2.15 ``DTensor``: ``_local_tensor``, ``_spec``)."""
    t.data = data
    if isinstance(data, DTensor):
        t._local_tensor = data._local_tensor
        t._spec = data._spec


def cast_input(t: Any, dtype: torch.dtype | None) -> Any:
    """Floating to ``dtype``, complex to its complex width; anything else (or ``dtype`` None) as
    is."""
    if dtype is None or not isinstance(t, torch.Tensor):
        return t
    if t.is_floating_point():
        return t.to(dtype)
    if t.is_complex():
        return t.to(torch.complex128 if dtype == torch.float64 else torch.complex64)
    return t


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Every ``torch.compile`` wrapper runs its original Python."""
    with torch.compiler.set_stance("force_eager"):
        yield


@contextlib.contextmanager
def autocast_as(device: torch.device, state: tuple[bool, torch.dtype | None]) -> Iterator[None]:
    """Autocast on ``device`` as a block ran under it in the job (or off)."""
    enabled, dtype = state
    if device.type not in ("cuda", "cpu"):
        yield
        return
    with torch.autocast(device.type, dtype=dtype, enabled=enabled):
        yield


def ungrouped_heads(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` with grouped key/value heads repeated and ``enable_gqa`` off.

    The memory-efficient kernel refuses grouped heads (pytorch/pytorch 001f694a
    ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``: ``supports_gqa = false`` under
    ``USE_ROCM``). A wrapper, not a mode: autograd recomputes checkpointed blocks on another
    thread."""

    @functools.wraps(forward)
    def call(q: Any, k: Any, v: Any, *args: Any, enable_gqa: bool = False,
             **kwargs: Any) -> Any:
        if enable_gqa and all(isinstance(t, torch.Tensor) and t.dim() >= 3
                              for t in (q, k, v)):
            heads, kv_heads = q.shape[-3], k.shape[-3]
            if kv_heads and heads != kv_heads and heads % kv_heads == 0:
                k = k.repeat_interleave(heads // kv_heads, dim=-3)
                v = v.repeat_interleave(heads // kv_heads, dim=-3)
                enable_gqa = False
        return forward(q, k, v, *args, enable_gqa=enable_gqa, **kwargs)

    return call


@contextlib.contextmanager
def efficient_attention(modules: list[nn.Module]) -> Iterator[None]:
    """The memory-efficient SDPA kernel first in TorchTitan's attention modules while the reference
    runs.

    TorchTitan's ``ScaledDotProductAttention`` prefers cuDNN, flash and math: in float32 only
    math takes the inputs, and it keeps every score (4 GiB more per 2048-token row of a 1.5B
    llama block). Eager replays keep the job's own choice."""
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:
        yield
        return
    saved: list[tuple[nn.Module, Any]] = []
    wrapped: list[nn.Module] = []
    try:
        for root in modules:
            for module in root.modules():
                backends = module.__dict__.get("sdpa_backends")
                if not isinstance(backends, list):
                    continue
                if "forward" not in module.__dict__:
                    module.forward = ungrouped_heads(module.forward)
                    wrapped.append(module)
                if SDPBackend.EFFICIENT_ATTENTION not in backends:
                    saved.append((module, backends))
                    module.sdpa_backends = [SDPBackend.EFFICIENT_ATTENTION, *backends]
        yield
    finally:
        for module in wrapped:
            del module.forward
        for module, backends in reversed(saved):
            module.sdpa_backends = backends


@contextlib.contextmanager
def reference_arithmetic(reference: Reference, held: Any, device: torch.device,
                         modules: list[nn.Module]) -> Iterator[None]:
    """Held down-casts, autocast off, TF32 as asked, efficient attention first in ``modules``."""
    off = (torch.autocast(device.type, enabled=False) if device.type in ("cuda", "cpu")
           else contextlib.nullcontext())
    with held, off, tf32(reference.tf32), efficient_attention(modules):
        yield
