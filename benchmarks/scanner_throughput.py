"""Buffer-store hazard scanner: throughput, cost relative to compiling, and false positives.

    python -m benchmarks.scanner_throughput [--repeat 20] [--no-compile]

Prints, measured side by side in one run on one core:

1. scanner throughput in MB/s of AMDGCN text (the committed corpus, tests/corpus/amdgcn);
2. scan time / compile time: every corpus kernel is compiled afresh by Triton (private
   cache) for gfx942 and gfx950 with buffer ops on and off, and its ``asm["amdgcn"]``
   scanned (median of 3 scans); target < 1%;
3. kernels flagged / kernels compiled on that clean corpus for the ``precise`` rule
   (target 0), the ``conservative`` rule and the wrong ``naive`` rule.

Needs triton for parts 2 and 3 (``--no-compile`` uses the committed files instead).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from types import ModuleType

from benchmarks.harness import REPO
from titan_rocm.scanner.scan import scan_text

CORPUS_DIR = REPO / "tests" / "corpus" / "amdgcn"
RULES = ("precise", "conservative", "naive")


def _one_core() -> str:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return f"pinned to CPU {min(os.sched_getaffinity(0))}"
    except (AttributeError, OSError):
        return "not pinned (no sched_setaffinity)"


def throughput(texts: list[str], repeat: int) -> tuple[float, float]:
    """(MB/s, seconds per pass) scanning ``texts`` with the precise rule."""
    size = sum(len(t.encode()) for t in texts)
    for t in texts:  # warm caches and regexes
        scan_text(t)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for t in texts:
            scan_text(t)
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e6, best


def _load_make_corpus() -> ModuleType:
    """The corpus maker, compiling into a fresh Triton cache (every compile a real one)."""
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="titan-rocm-bench-")
    from tests.corpus import make_corpus

    return make_corpus


def compile_and_scan() -> list[tuple[str, str, float, float]]:
    """Compile every corpus variant; return (name, asm, compile seconds, scan seconds)."""
    mc = _load_make_corpus()
    # Warm-up (imports, LLVM init), not counted; another arch so no timed compile hits it.
    mc.compile_spec(mc.SPECS[0], "gfx90a", True)
    mc.compile_spec(mc.SPECS[0], "gfx90a", False)
    out = []
    for spec in mc.SPECS:
        for arch in mc.ARCHS:
            for buffer_ops in (True, False):
                asm, compile_s = mc.compile_spec(spec, arch, buffer_ops)
                runs = []
                for _ in range(3):  # median of 3: other processes share these cores
                    t0 = time.perf_counter()
                    scan_text(asm)
                    runs.append(time.perf_counter() - t0)
                scan_s = sorted(runs)[1]
                out.append((mc.corpus_name(spec, arch, buffer_ops), asm, compile_s, scan_s))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the three figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="throughput passes (best kept)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip compiling; rule counts over the committed corpus")
    args = parser.parse_args(argv)
    print(f"scanner benchmark ({_one_core()}, python {sys.version.split()[0]})")

    files = sorted(CORPUS_DIR.glob("*.amdgcn"))
    texts = [f.read_text() for f in files]
    mbs, per_pass = throughput(texts, args.repeat)
    size = sum(len(t.encode()) for t in texts)
    print(f"1. throughput: {mbs:.1f} MB/s  ({len(texts)} files, {size / 1e6:.2f} MB, "
          f"{per_pass * 1e3:.1f} ms per pass, best of {args.repeat})")

    if args.no_compile:
        named = [(f.name, t) for f, t in zip(files, texts, strict=True)]
    else:
        compiled = compile_and_scan()
        total_compile = sum(c for _, _, c, _ in compiled)
        total_scan = sum(s for _, _, _, s in compiled)
        worst = max(compiled, key=lambda r: r[3] / r[2])
        print(f"2. scan / compile: {total_scan / total_compile:.3%}  "
              f"(scan {total_scan * 1e3:.1f} ms / compile {total_compile:.2f} s over "
              f"{len(compiled)} fresh compiles; worst kernel {worst[0]}: "
              f"{worst[3] * 1e3:.2f} ms / {worst[2] * 1e3:.0f} ms = {worst[3] / worst[2]:.2%}; "
              "target < 1%)")
        named = [(n, a) for n, a, _, _ in compiled]

    print(f"3. kernels flagged / kernels compiled (clean corpus, {len(named)} kernels):")
    for rule in RULES:
        reports = [scan_text(t, rule=rule) for _, t in named]
        stores = sum(r.stores_checked for r in reports)
        flagged_stores = sum(len(r.hazards) for r in reports)
        flagged = sum(1 for r in reports if r.hazardous)
        target = "  (target 0)" if rule == "precise" else ""
        print(f"   {rule:<12} {flagged}/{len(named)} kernels = {flagged / len(named):.3f}; "
              f"{flagged_stores}/{stores} wide buffer stores{target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
