"""Real Triton kernels cross-compiled for gfx942 on a CPU, for the compile-wrapper tests.

With bf16, 8 elements per thread, ``tt.pointer_range=32`` and ``tt.divisibility=16`` on the
pointers and the size, Triton 3.9 stores with ``buffer_store_dwordx4`` (buffer ops on) or
``global_store_dwordx4`` (buffer ops off). Importable by name from subprocesses too (tests/
is on their PYTHONPATH).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

GFX942 = GPUTarget("hip", "gfx942", 64)
OPTIONS = {"num_warps": 4}


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * 2, mask=mask)


@triton.jit
def silu_mul_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    y = a * tl.sigmoid(a) * b
    tl.store(y_ptr + offs, y.to(tl.bfloat16), mask=mask)


_PTR_ATTRS = [["tt.divisibility", 16], ["tt.pointer_range", 32]]


def source(kind: str = "scale", block: int = 2048) -> ASTSource:
    """An ASTSource whose gfx942 code stores with dwordx4 (``block`` = 2048 for 4 warps of
    64 lanes at 8 bf16 each; other multiples make distinct cache keys)."""
    if kind == "scale":
        sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr"}
        fn, n_ptrs = scale_kernel, 2
    elif kind == "silu_mul":
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "n": "i32",
               "BLOCK": "constexpr"}
        fn, n_ptrs = silu_mul_kernel, 3
    else:
        raise ValueError(f"unknown kernel kind {kind!r}; accepted: scale, silu_mul")
    attrs = {(i,): list(_PTR_ATTRS) for i in range(n_ptrs)}
    attrs[(n_ptrs,)] = [["tt.divisibility", 16]]
    return ASTSource(fn=fn, signature=sig, constexprs={"BLOCK": block}, attrs=attrs)


def compile_gfx942(kind: str = "scale", block: int = 2048):
    """Compile through ``triton.compile`` (the name Inductor calls)."""
    return triton.compile(source(kind, block), target=GFX942, options=dict(OPTIONS))


def stores(kernel) -> list[str]:
    """The >64-bit store mnemonics in a compiled kernel's AMDGCN."""
    return [line.split()[0] for line in kernel.asm["amdgcn"].splitlines()
            if line.strip().startswith(("buffer_store", "global_store"))]


def compile_in_worker(kind: str, block: int) -> dict:
    """Run in a compile worker: compile, and say whether the wrapper was active there."""
    import os

    from titan_rocm.workarounds.triton_war import compile_hook

    kernel = compile_gfx942(kind, block)
    return {"pid": os.getpid(), "stores": stores(kernel), "hash": kernel.hash,
            "bound": compile_hook.bound_sites() if compile_hook.installed() else None}
