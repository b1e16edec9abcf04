"""Regenerate tests/corpus/amdgcn/: real Triton kernels cross-compiled for AMD on a CPU.

    python tests/corpus/make_corpus.py            # rewrite every .amdgcn file
    python tests/corpus/make_corpus.py --check    # compile and compare, write nothing

Each kernel is compiled with ``triton.compile(ASTSource(...), target=GPUTarget("hip",
arch, 64))`` for gfx942 and gfx950, with buffer ops on and off
(``triton.knobs.amd.use_buffer_ops`` under ``triton.knobs.amd.scope()``), into a private
Triton cache so nothing stale is reused. ``dwordx4`` buffer stores need bf16 with 8
elements per thread and ``tt.pointer_range`` = 32 / ``tt.divisibility`` = 16 on pointers
and sizes, which the specs below give.

Needs triton (3.9.0 made the committed files); torch is not needed. The benchmark
``benchmarks/scanner_throughput.py`` imports :data:`SPECS` and :func:`compile_spec` to
time compiles beside scans.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# A private cache: a compile here must really compile (and never reuse another variant).
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="titan-rocm-corpus-"))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

CORPUS_DIR = Path(__file__).resolve().parent / "amdgcn"
ARCHS = ("gfx942", "gfx950")


@triton.jit
def swiglu_bwd(g_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr):
    """Inductor's SwiGLU backward fusion, by hand: da = g*b*silu'(a), db = g*silu(a)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(g_ptr + offs, mask=m).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=m).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=m).to(tl.float32)
    s = tl.sigmoid(a)
    da = g * b * s * (1.0 + a * (1.0 - s))
    db = g * a * s
    tl.store(da_ptr + offs, da.to(tl.bfloat16), mask=m)
    tl.store(db_ptr + offs, db.to(tl.bfloat16), mask=m)


@triton.jit
def swiglu_fwd(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = silu(a) * b."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=m).to(tl.float32)
    tl.store(out_ptr + offs, (a * tl.sigmoid(a) * b).to(tl.bfloat16), mask=m)


@triton.jit
def swiglu_bwd_loop(g_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr):
    """Grid-stride SwiGLU backward: stores inside a loop (back-edges in the CFG)."""
    start = tl.program_id(0) * BLOCK
    step = tl.num_programs(0) * BLOCK
    for base in range(start, n, step):
        offs = base + tl.arange(0, BLOCK)
        m = offs < n
        g = tl.load(g_ptr + offs, mask=m).to(tl.float32)
        a = tl.load(a_ptr + offs, mask=m).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=m).to(tl.float32)
        s = tl.sigmoid(a)
        tl.store(da_ptr + offs, (g * b * s * (1.0 + a * (1.0 - s))).to(tl.bfloat16), mask=m)
        tl.store(db_ptr + offs, (g * a * s).to(tl.bfloat16), mask=m)


@triton.jit
def softmax_fwd(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    """Row softmax, one row per program."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(tl.bfloat16), mask=m)


@triton.jit
def softmax_bwd(dy_ptr, y_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr):
    """Row softmax backward: dx = y * (dy - sum(dy * y))."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    dy = tl.load(dy_ptr + row * n_cols + cols, mask=m).to(tl.float32)
    y = tl.load(y_ptr + row * n_cols + cols, mask=m).to(tl.float32)
    dx = y * (dy - tl.sum(dy * y, axis=0))
    tl.store(dx_ptr + row * n_cols + cols, dx.to(tl.bfloat16), mask=m)


@triton.jit
def layernorm_fwd(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, BLOCK: tl.constexpr):
    """LayerNorm forward, one row per program; keeps mean and rstd for the backward."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(m, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + 1e-5)
    w = tl.load(w_ptr + cols, mask=m).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=m).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (xc * rstd * w + b).to(tl.bfloat16), mask=m)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def layernorm_bwd_dx(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr
):
    """LayerNorm backward for the input gradient, one row per program."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=m).to(tl.float32)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xhat = tl.where(m, (x - mean) * rstd, 0.0)
    wdy = w * dy
    c1 = tl.sum(xhat * wdy, axis=0) / n_cols
    c2 = tl.sum(wdy, axis=0) / n_cols
    tl.store(dx_ptr + row * n_cols + cols, ((wdy - (xhat * c1 + c2)) * rstd).to(tl.bfloat16),
             mask=m)


@triton.jit
def rmsnorm_fwd(x_ptr, w_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    """RMSNorm forward, one row per program."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    rrms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + 1e-6)
    w = tl.load(w_ptr + cols, mask=m).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (x * rrms * w).to(tl.bfloat16), mask=m)


@triton.jit
def scale_rows(x_ptr, y_ptr, n_rows, stride, BLOCK: tl.constexpr):
    """Row loop with a runtime stride: the store sits in a loop the compiler may unroll."""
    cols = tl.arange(0, BLOCK)
    for i in range(0, n_rows):
        x = tl.load(x_ptr + i * stride + cols).to(tl.float32)
        tl.store(y_ptr + i * stride + cols, (x * 2.0).to(tl.bfloat16))


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """C = A @ B in bf16 with an fp32 accumulator (row-major, unit inner strides)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * stride_am + rk[None, :]
    b = b_ptr + rk[:, None] * stride_bk + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _k in range(0, K, BK):
        acc += tl.dot(tl.load(a), tl.load(b))
        a += BK
        b += BK * stride_bk
    c = c_ptr + rm[:, None] * stride_cm + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c, acc.to(tl.bfloat16), mask=mask)


@dataclass(frozen=True)
class Spec:
    """One kernel to compile: its jit function, argument types and compile options."""

    name: str
    fn: object
    signature: dict[str, str]
    constexprs: dict[str, int]
    num_warps: int = 4
    # Argument names given tt.divisibility=16 (pointers also get tt.pointer_range=32).
    aligned: tuple[str, ...] = field(default=())


def _elementwise(name: str, fn: object, n_ptrs: int, warps: int, block: int) -> Spec:
    ptr_names = [p for p in fn.arg_names if p.endswith("_ptr")]  # type: ignore[attr-defined]
    assert len(ptr_names) == n_ptrs, (name, ptr_names)
    sig = {p: "*bf16" for p in ptr_names}
    sig.update({"n": "i32", "BLOCK": "constexpr"})
    return Spec(name, fn, sig, {"BLOCK": block}, warps, tuple(ptr_names) + ("n",))


def _rowwise(name: str, fn: object, warps: int, block: int, fp32: tuple[str, ...] = ()) -> Spec:
    ptr_names = [p for p in fn.arg_names if p.endswith("_ptr")]  # type: ignore[attr-defined]
    sig = {p: ("*fp32" if p in fp32 else "*bf16") for p in ptr_names}
    sig.update({"n_cols": "i32", "BLOCK": "constexpr"})
    return Spec(name, fn, sig, {"BLOCK": block}, warps, tuple(ptr_names) + ("n_cols",))


SPECS: tuple[Spec, ...] = (
    # 8 bf16 elements per thread: BLOCK = 8 * 64 lanes * num_warps.
    _elementwise("swiglu_bwd", swiglu_bwd, 5, 4, 2048),
    _elementwise("swiglu_bwd_w8", swiglu_bwd, 5, 8, 4096),
    _elementwise("swiglu_fwd", swiglu_fwd, 3, 4, 2048),
    _elementwise("swiglu_bwd_loop", swiglu_bwd_loop, 5, 4, 2048),
    _rowwise("softmax_fwd", softmax_fwd, 4, 2048),
    _rowwise("softmax_bwd", softmax_bwd, 8, 4096),
    _rowwise("layernorm_fwd", layernorm_fwd, 4, 2048, fp32=("mean_ptr", "rstd_ptr")),
    _rowwise("layernorm_bwd_dx", layernorm_bwd_dx, 4, 2048, fp32=("mean_ptr", "rstd_ptr")),
    _rowwise("rmsnorm_fwd", rmsnorm_fwd, 8, 4096),
    Spec(
        "scale_rows",
        scale_rows,
        {"x_ptr": "*bf16", "y_ptr": "*bf16", "n_rows": "i32", "stride": "i32",
         "BLOCK": "constexpr"},
        {"BLOCK": 2048},
        4,
        ("x_ptr", "y_ptr", "n_rows", "stride"),
    ),
    Spec(
        "matmul",
        matmul,
        {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32",
         "K": "i32", "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32",
         "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"},
        {"BM": 128, "BN": 128, "BK": 64},
        8,
        ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm"),
    ),
)


def compile_spec(spec: Spec, arch: str, buffer_ops: bool) -> tuple[str, float]:
    """Compile ``spec`` for ``arch``; return (AMDGCN text, seconds the compile took)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(spec.signature)
    attrs: dict[tuple[int, ...], list[list[object]]] = {}
    for i, name in enumerate(names):
        if name in spec.aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
            if spec.signature[name].startswith("*"):
                attrs[(i,)].append(["tt.pointer_range", 32])
    src = ASTSource(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs,
                    attrs=attrs)
    with triton.knobs.amd.scope():
        triton.knobs.amd.use_buffer_ops = buffer_ops
        t0 = time.perf_counter()
        kernel = triton.compile(src, target=GPUTarget("hip", arch, 64),
                                options={"num_warps": spec.num_warps})
        seconds = time.perf_counter() - t0
    return kernel.asm["amdgcn"], seconds


def corpus_name(spec: Spec, arch: str, buffer_ops: bool) -> str:
    """File name of one variant, e.g. ``swiglu_bwd-gfx942-buf.amdgcn``."""
    return f"{spec.name}-{arch}-{'buf' if buffer_ops else 'nobuf'}.amdgcn"


def _strip_paths(text: str) -> str:
    # .file directives carry the absolute path of this script: keep the corpus portable.
    here = str(Path(__file__).resolve().parent)
    return text.replace(here, "tests/corpus")


def main(argv: list[str] | None = None) -> int:
    """Compile every spec for every arch, buffer ops on and off; write or check the files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--only", default="", help="compile only specs whose name has this")
    args = parser.parse_args(argv)
    CORPUS_DIR.mkdir(parents=True, exist_ok=True)
    differ = 0
    for spec in SPECS:
        if args.only and args.only not in spec.name:
            continue
        for arch in ARCHS:
            for buffer_ops in (True, False):
                text, seconds = compile_spec(spec, arch, buffer_ops)
                text = _strip_paths(text)
                path = CORPUS_DIR / corpus_name(spec, arch, buffer_ops)
                stores = text.count("buffer_store_dwordx4")
                print(f"{path.name:<40} {seconds:6.2f}s  buffer_store_dwordx4: {stores}")
                if args.check:
                    if not path.exists() or path.read_text() != text:
                        differ += 1
                        print(f"  differs from {path}")
                else:
                    path.write_text(text)
    if args.check and differ:
        print(f"{differ} file(s) differ (another Triton version?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
