"""The two replays' precisions: eager at the job's own, and the high-precision reference
(docs/numerics-audit.md gives which reference ``auto`` picks and why).

Eager is ``set_stance("force_eager")`` with the job's parameters, FSDP dtypes and autocast as
they are. The reference is eager too, autocast off, parameters re-typed in place (``.data``
swapped, an exact round trip) or, under FSDP, all-gathered at their sharded float32
(:func:`titan_rocm.numerics.fsdp.raised_to_sharded_dtype`: sharded parameters cannot be
re-typed in place, so FSDP's reference is float32 whatever is asked), with the model's own
low-precision casts held (:class:`~titan_rocm.numerics.held_precision.HeldPrecision`).
"""

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
"""The choices of ``[rocm] numerics_audit_reference``."""


@dataclass(frozen=True)
class Reference:
    """The reference replay's arithmetic."""

    dtype: torch.dtype
    tf32: bool = False

    @property
    def name(self) -> str:
        """``float64``, ``float32`` or ``float32 (TF32 GEMMs)``."""
        text = str(self.dtype).removeprefix("torch.")
        return f"{text} (TF32 GEMMs)" if self.tf32 else text


def choose_reference(choice: str, job_dtype: torch.dtype, sharded: bool,
                     device: torch.device) -> tuple[Reference, str | None]:
    """The reference for ``choice`` (one of :data:`REFERENCES`), and a note when the job's
    layout or device changed what was asked."""
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
    """The floating parameters and buffers of ``modules`` (less ``exclude``'s) in ``dtype``, or
    under FSDP at their sharded dtype; exactly as before on exit.
    """
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
    """``t.data = data``, DTensors included: on one it swaps only the wrapper's metadata, so
    this swaps the local shard and spec its operators read too (torch 2.13-2.15 ``DTensor``:
    ``_local_tensor``, ``_spec``).
    """
    t.data = data
    if isinstance(data, DTensor):
        t._local_tensor = data._local_tensor
        t._spec = data._spec


def cast_input(t: Any, dtype: torch.dtype | None) -> Any:
    """An input tensor at the reference's width (floating to ``dtype``, complex to its complex
    width); anything else, and everything when ``dtype`` is None, as it is."""
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
    """An attention module's ``forward`` that repeats grouped key/value heads to the query's
    (what torch's math kernel does) and calls ``forward`` with ``enable_gqa`` off.

    The memory-efficient kernel refuses grouped heads (pytorch/pytorch 001f694a
    ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``: ``supports_gqa = false`` under
    ``USE_ROCM``), so a llama's float32 reference would fall to the slow, score-keeping math
    kernel. It wraps ``forward`` rather than using a mode: a mode is the calling thread's,
    and autograd recomputes checkpointed blocks on the device's own thread.
    """

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
    """The memory-efficient SDPA kernel first in TorchTitan's attention modules while the
    reference runs, grouped heads repeated (:func:`ungrouped_heads`).

    TorchTitan's ``ScaledDotProductAttention`` (0.2.2 ``torchtitan/models/attention.py``,
    0.3.0 ``torchtitan/models/common/attention.py``) prefers cuDNN, flash and math: in float32
    only math takes the inputs, and it keeps every score (4 GiB more per 2048-token row of a
    1.5B llama block). Eager replays keep the job's own choice.
    """
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
    """Held down-casts (``held``: a :class:`HeldPrecision`, or a stand-in holding none),
    autocast off, TF32 as the reference asks, the memory-efficient attention kernel first in
    ``modules`` (forward and backward)."""
    off = (torch.autocast(device.type, enabled=False) if device.type in ("cuda", "cpu")
           else contextlib.nullcontext())
    with held, off, tf32(reference.tf32), efficient_attention(modules):
        yield
