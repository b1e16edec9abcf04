"""Trainer side of benchmarks/mla_varlen_packing.py: titan-rocm's varlen MLA on an NVIDIA GPU.

aiter cannot run on an H200. This runner, before TorchTitan's trainer starts:

1. puts the test fake aiter of aiter main (``tests/fake_aiter/main``: aiter's names, wrappers
   and dispatch gates) on ``sys.path``;
2. replaces the fake's fp32 reference forward kernels with PyTorch's own, for speed: varlen
   with its flash varlen attention (``torch.nn.attention.varlen.varlen_attn``, the kernel
   TorchTitan's ``varlen`` attention uses; flash needs equal head dims, so v (128) is
   zero-padded to q/k's 192 and the output cut back: exact), dense (the ``drop`` control run)
   with ``scaled_dot_product_attention``. The backward kernels stay the fake's own closed-form
   fp32 ones: they use no autograd, which a kernel called inside a custom op (autograd left
   behind) on the autograd engine's device thread (a nested backward deadlocks) must not;
3. pretends the machine is an MI300X (gfx942) with aiter main (``platform.override``), so
   titan-rocm's converter, routing, custom ops, document spans and guard all run as there;
4. runs ``benchmarks.torchtitan_runner`` (TorchTitan's trainer, unchanged), and at exit
   prints ``TITAN_ROCM_MLA_CALLS {json}``: how often each fake aiter kernel ran.

What this exercises for real: the packing of (batch, heads, seqlen, dim) into (tokens, heads,
dim) and back, cu_seqlens from TorchTitan's document boundaries, the BlockMask-shaped carrier
through DeepSeek's attention, torch.compile and selective op checkpointing. Not aiter's
kernels, not ROCm.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import sys
from typing import Any

from benchmarks.harness import REPO

FAKE_AITER = REPO / "tests" / "fake_aiter"


def _causal(is_causal: bool) -> dict[str, Any]:
    """varlen_attn's causal argument: ``window_size=(-1, 0)`` (torch 2.11 on, what TorchTitan
    0.2.2 passes) or ``is_causal`` (torch 2.10)."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    if "window_size" in inspect.signature(varlen_attn).parameters:
        return {"window_size": (-1, 0) if is_causal else (-1, -1)}
    return {"is_causal": is_causal}


def _padded(v: Any, width: int) -> Any:
    import torch.nn.functional as F

    return F.pad(v, (0, width - v.shape[-1])) if v.shape[-1] < width else v


def flash_varlen_forward(name: str, q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                         dropout_p: float, softmax_scale: float, is_causal: bool, out: Any = None,
                         bias: Any = None, alibi_slopes: Any = None, return_lse: bool = True,
                         max_seqlen_q: int = 0, **details: Any) -> tuple[Any, Any, Any, Any]:
    """The fake's varlen forward kernel, computed by PyTorch's flash varlen attention."""
    import fake_aiter_support
    import torch
    from torch.nn.attention.varlen import varlen_attn

    if dropout_p or bias is not None or alibi_slopes is not None:
        raise NotImplementedError("flash replacement: no dropout, bias or alibi")
    fake_aiter_support.record(name)
    result = varlen_attn(q, k, _padded(v, q.shape[-1]), cu_seqlens_q, cu_seqlens_k,
                         max_seqlen_q, max_seqlen_q, scale=softmax_scale,
                         **_causal(is_causal))[..., : v.shape[-1]].contiguous()
    if out is not None:
        out.copy_(result)
        result = out
    # The lse layout aiter's varlen forward returns; the replacement backward recomputes
    # instead of reading it.
    lse = torch.zeros((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    return result, lse, torch.empty(0, device=q.device), torch.zeros(2, dtype=torch.int64,
                                                                      device=q.device)


def _sdpa_bshd(q: Any, k: Any, v: Any, softmax_scale: float, is_causal: bool) -> Any:
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         scale=softmax_scale, is_causal=is_causal)
    return out.transpose(1, 2)


def sdpa_forward(name: str, q: Any, k: Any, v: Any, dropout_p: float, softmax_scale: float,
                 is_causal: bool, out: Any = None, bias: Any = None, alibi_slopes: Any = None,
                 return_lse: bool = True, **details: Any) -> tuple[Any, Any, Any, Any]:
    """The fake's dense forward kernel (bshd), computed by PyTorch SDPA."""
    import fake_aiter_support
    import torch

    if dropout_p or bias is not None or alibi_slopes is not None:
        raise NotImplementedError("SDPA replacement: no dropout, bias or alibi")
    fake_aiter_support.record(name)
    result = _sdpa_bshd(q, k, v, softmax_scale, is_causal).contiguous()
    if out is not None:
        out.copy_(result)
        result = out
    lse = torch.zeros((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32,
                      device=q.device)  # unread: the backward recomputes
    return result, lse, torch.empty(0, device=q.device), torch.zeros(2, dtype=torch.int64,
                                                                      device=q.device)


def install(aiter: str = "main", arch: str = "gfx942") -> contextlib.ExitStack:
    """Fake aiter with flash varlen kernels on sys.path, and the simulated platform in force
    (until the returned stack closes: never, in a trainer process)."""
    sys.path[:0] = [str(FAKE_AITER / aiter), str(FAKE_AITER)]
    import fake_aiter_support

    from titan_rocm import platform
    from titan_rocm.platform import PlatformFacts

    fake_aiter_support.varlen_forward_kernel = flash_varlen_forward
    fake_aiter_support.forward_kernel = sdpa_forward
    fake_aiter_support.reset(arch)
    stack = contextlib.ExitStack()
    stack.enter_context(platform.override(PlatformFacts.simulated_rocm(arch, aiter=aiter)))
    return stack


def _report() -> None:
    import fake_aiter_support

    counts = collections.Counter(fake_aiter_support.names())
    print("TITAN_ROCM_MLA_CALLS " + json.dumps(dict(sorted(counts.items()))), flush=True)


_INSTALLED: list[contextlib.ExitStack] = []
"""Keeps the simulation in force: an unreferenced stack's override generator is finalised
by the garbage collector, which takes the simulated platform away again."""


def prepare() -> None:
    """The fake aiter and the simulated MI300X, in force for the rest of this process."""
    _INSTALLED.append(install())


def main() -> None:
    """Set up, then run TorchTitan's trainer with this process's arguments."""
    prepare()
    atexit.register(_report)
    from benchmarks import torchtitan_runner

    torchtitan_runner.main()


if __name__ == "__main__":
    main()
