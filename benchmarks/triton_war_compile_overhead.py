"""Compile time with the triton_war wrapper installed / without, on a clean corpus.

    python -m benchmarks.triton_war_compile_overhead [--rounds 5]

The corpus is the scanner's (tests/corpus/make_corpus.py ``SPECS``: SwiGLU fwd/bwd,
softmax, layernorm, RMSNorm, matmul...), cross-compiled for gfx942 and gfx950 with buffer
ops on (Triton's default) on this CPU. Every compile is a real one
(``knobs.compilation.always_compile``, private cache) after one warm-up compile per
kernel. Each round compiles every kernel through Triton's own ``compile`` and through the
wrapper, back to back, alternating by round which goes first; per kernel the median and the
minimum over rounds are taken, and their sums compared (on a shared machine the minimum is
the least noisy). Printed:

1. compile time with wrapper / without (target <= 1.01); the same procedure run with
   Triton's compile against itself (a control: how far the ratio moves by noise alone on
   this machine); and the scan's own share measured directly (scan time / compile time),
   which is what the ratio should reflect;
2. kernels recompiled / kernels compiled on this clean corpus: 0 for the ``precise`` rule
   (target), with the ``conservative`` rule and the wrong ``naive`` rule beside it.

Needs triton; not torch.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time

ARCHS = ("gfx942", "gfx950")


def _load_corpus():
    from tests.corpus import make_corpus

    return make_corpus.SPECS


def _source(spec):
    from triton.compiler import ASTSource

    attrs: dict[tuple[int, ...], list[list[object]]] = {}
    for i, name in enumerate(spec.signature):
        if name in spec.aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
            if spec.signature[name].startswith("*"):
                attrs[(i,)].append(["tt.pointer_range", 32])
    return ASTSource(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs,
                     attrs=attrs)


def _pin_one_core() -> str:
    try:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    except (AttributeError, OSError):
        return "not pinned"


def main(argv: list[str] | None = None) -> int:
    """Compile side by side; print the ratios; 0 when within the targets."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6,
                        help="compiles per kernel and variant (even: each goes first equally)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    # Before triton loads: a private cache (every compile real), buffer ops as Triton defaults.
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="titan-rocm-war-bench-")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    os.environ.pop("AMDGCN_USE_BUFFER_OPS", None)

    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    from titan_rocm.scanner.scan import scan_text
    from titan_rocm.workarounds.triton_war import compile_hook, stats

    pinned = _pin_one_core()
    knobs.compilation.always_compile = True  # every compile really compiles
    jobs = [(spec, arch) for spec in _load_corpus() for arch in ARCHS]
    hook = compile_hook.install(rule="precise")
    plain, wrapped = hook.original, hook.wrapper

    def compile_with(fn, spec, arch):
        src = _source(spec)
        t0 = time.perf_counter()
        kernel = fn(src, target=GPUTarget("hip", arch, 64),
                    options={"num_warps": spec.num_warps})
        return kernel, time.perf_counter() - t0

    # Warm-up: a kernel's first compile pays one-time costs (parsing the jit function,
    # LLVM and backend set-up) that neither variant should carry.
    for spec, arch in jobs:
        compile_with(plain, spec, arch)
    stats.reset_local()

    def side_by_side(a, b) -> tuple[dict[str, float], dict[str, float]]:
        """Sums over kernels of the per-kernel median and minimum seconds of ``a`` and ``b``.
        The second compile of a pair runs a little faster (warm caches): which variant goes
        first alternates by round, so each kernel gets both orders equally."""
        times: dict[str, dict[int, list[float]]] = {"a": {}, "b": {}}
        for r in range(args.rounds):
            for i, (spec, arch) in enumerate(jobs):
                order = [("a", a), ("b", b)]
                if r % 2:
                    order.reverse()
                for label, fn in order:
                    _kernel, seconds = compile_with(fn, spec, arch)
                    times[label].setdefault(i, []).append(seconds)
        median = {k: sum(statistics.median(v) for v in per.values()) for k, per in times.items()}
        best = {k: sum(min(v) for v in per.values()) for k, per in times.items()}
        return median, best

    median, best = side_by_side(plain, wrapped)
    precise_stats = stats.local()
    # Control: Triton's compile against itself, same procedure: the noise floor of a ratio.
    control_median, control_best = side_by_side(plain, plain)
    ratio = median["b"] / median["a"]
    ratio_min = best["b"] / best["a"]
    total = {"without": median["a"], "with": median["b"]}

    scan_share: list[tuple[float, float]] = []
    for spec, arch in jobs:
        kernel, seconds = compile_with(plain, spec, arch)
        t0 = time.perf_counter()
        scan_text(kernel.asm["amdgcn"], arch=arch, rule="precise")
        scan_share.append((time.perf_counter() - t0, seconds))
    scan_s = sum(s for s, _ in scan_share)
    compile_s = sum(c for _, c in scan_share)

    # Recompiles under the other rules (counts only; the wrapper's per-kernel warnings are
    # silenced, the counts say it all).
    logging.getLogger("titan_rocm").setLevel(logging.ERROR)
    knobs.compilation.always_compile = False
    recompiles = {"precise": (precise_stats.hazardous, precise_stats.compiled)}
    for rule in ("conservative", "naive"):
        stats.reset_local()
        if rule == "naive":  # not a user-selectable rule: inject it as the scanner
            compile_hook.install(scanner=lambda t, a, _r: scan_text(t, arch=a, rule="naive"))
        else:
            compile_hook.install(rule=rule)
        for spec, arch in jobs:
            compile_with(triton.compile, spec, arch)
        s = stats.local()
        recompiles[rule] = (s.hazardous, s.compiled)
    compile_hook.uninstall()

    print(f"triton {triton.__version__}, {len(jobs)} kernels ({len(jobs) // len(ARCHS)} x "
          f"{', '.join(ARCHS)}), buffer ops on, {args.rounds} rounds, {pinned}")
    print(f"compile time without wrapper (sum of per-kernel medians): {total['without']:.3f} s")
    print(f"compile time with wrapper    (sum of per-kernel medians): {total['with']:.3f} s")
    print(f"RATIO compile time with / without wrapper (medians): {ratio:.4f}  (target <= 1.01)")
    print(f"RATIO compile time with / without wrapper (minimums, least noisy): {ratio_min:.4f}"
          f"  ({best['b']:.3f} s / {best['a']:.3f} s)")
    print(f"control, Triton's compile / itself, same procedure: medians "
          f"{control_median['b'] / control_median['a']:.4f}, minimums "
          f"{control_best['b'] / control_best['a']:.4f}  (how far 1.0 moves by noise alone)")
    print(f"scan time / compile time, measured directly: {scan_s / compile_s:.4%} "
          f"({scan_s * 1000:.1f} ms of scans over {compile_s:.2f} s of compiles)")
    for rule, (flagged, compiled) in recompiles.items():
        target = "  (target 0)" if rule == "precise" else ""
        print(f"RATIO kernels recompiled / compiled, rule {rule:12s}: {flagged}/{compiled} = "
              f"{flagged / compiled:.3f}{target}")
    ok = min(ratio, ratio_min) <= 1.01 and recompiles["precise"][0] == 0
    print("RESULT:", "within targets" if ok else "OUTSIDE targets")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
