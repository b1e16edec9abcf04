"""``titan-rocm gemm-tables capture-safe``: peak memory (RSS) on a small and a 10x larger table.

    python -m benchmarks.gemm_tables_memory [--sizes-mb 5 50] [--out DIR]

CPU only, torch-free. Generates tuned BF16 GEMM tables of the given sizes (rows of every
kind aiter's tables hold, made-up values; about 40 % removed by the capture rules), then
runs ``capture-safe TABLE -o OUTDIR --aiter main`` on each in a fresh Python process and
prints that process's peak RSS side by side, with the ratio largest / smallest. Streaming
keeps it flat: the ratio should stay near 1.0 (before streaming: 837 MiB on 50 MB, issue
26). ``--out DIR`` also writes the figures to ``DIR/summary.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

HEADER = (
    "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,"
    "kernelName,err_ratio,tflops,bw\n"
)
# (gfx, cu_num, libtype, solidx range, splitK choices, kernel name), weighted like aiter's
# tables: asm split-K and opus split-K rows are removed, the others kept.
KINDS = (
    ("gfx950", 256, "asm", (0, 64), (2, 8, 13),
     "_ZN5aiter39bf16gemm_fp32bf16_tn_64x64_splitk_cleanE", 6),
    ("gfx950", 256, "asm", (0, 64), (0, 1), "_ZN5aiter26bf16gemm_bf16_tn_256x256E", 9),
    ("gfx950", 256, "flydsl", (0, 64), (0,),
     "flydsl_gemm2_abf16_wbf16_bf16_t64x64x128_split_k4_x", 30),
    ("gfx950", 256, "opus", (200, 300), (0, 4), "opus_gemm_flatmm_splitk_x", 1),
    ("gfx950", 256, "opus", (1, 200), (0,), "opus_gemm_512x256_x", 2),
    ("gfx950", 256, "torch", (0, 1), (0,), "native", 13),
    ("gfx942", 80, "opus", (10200, 10300), (0, 2), "opus_gemm_gfx942_splitk_x", 2),
    ("gfx942", 80, "opus", (10000, 10200), (0,), "opus_gemm_gfx942_wkc_x", 3),
    ("gfx1250", 96, "triton", (0, 1), (0,), "auto", 24),
)


def make_table(path: Path, size_bytes: int, seed: int = 0) -> int:
    """Write a table of about ``size_bytes``; return its data rows."""
    rng = random.Random(seed)
    weights = [k[-1] for k in KINDS]
    rows = 0
    with path.open("w") as handle:
        handle.write(HEADER)
        written = len(HEADER)
        while written < size_bytes:
            gfx, cu, libtype, (lo, hi), splits, name, _ = rng.choices(KINDS, weights)[0]
            line = (f"{gfx},{cu},{rng.randrange(1, 8192)},{rng.choice((512, 2048, 7168))},"
                    f"{rng.choice((1536, 4096, 7168))},False,torch.bfloat16,torch.bfloat16,"
                    f"False,False,{libtype},{rng.randrange(lo, hi)},{rng.choice(splits)},"
                    f"{rng.uniform(2, 400):.3f},{name},0.0,{rng.uniform(1, 900):.2f},"
                    f"{rng.uniform(10, 5000):.2f}\n")
            handle.write(line)
            written += len(line)
            rows += 1
    return rows


def child(table: str, outdir: str) -> None:
    """Run the tool in this process; print its exit code and this process's peak RSS."""
    from titan_rocm.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["gemm-tables", "capture-safe", table, "-o", outdir, "--aiter", "main"])
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"exit": code, "peak_rss_mib": round(peak_kib / 1024, 1)}))


def baseline() -> float:
    """Peak RSS (MiB) of a Python process that only imports the tool."""
    code = ("import resource; import titan_rocm.cli.gemm_tables; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    return round(float(subprocess.run([sys.executable, "-c", code], check=True, cwd=harness.REPO,
                                      env=harness.child_env(), capture_output=True,
                                      text=True).stdout), 1)


def main(argv: list[str] | None = None) -> int:
    """Measure each size in a fresh process; print the figures (and store them with --out)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[5.0, 50.0])
    parser.add_argument("--out", type=Path, help="write summary.json here")
    parser.add_argument("--child", nargs=2, metavar=("TABLE", "OUTDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    bad = [s for s in args.sizes_mb if not (0 < s <= 10_000)]
    if bad:
        parser.error(f"--sizes-mb {bad[0]!r}: accepted 0 < size <= 10000")
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, size in enumerate(args.sizes_mb):
            table = Path(tmp) / f"t{i}_bf16_tuned_gemm.csv"
            rows = make_table(table, int(size * 1e6), seed=i)
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.gemm_tables_memory", "--child", str(table),
                 str(Path(tmp) / f"out{i}")], check=True, cwd=harness.REPO,
                env=harness.child_env(), capture_output=True, text=True)
            measured = json.loads(out.stdout.strip().splitlines()[-1])
            figures.append({"size_mb": round(table.stat().st_size / 1e6, 1), "rows": rows,
                            **measured})
            table.unlink()
    base = baseline()
    print(f"{'table':>10}  {'rows':>9}  {'peak RSS':>10}  exit")
    for f in figures:
        print(f"{f['size_mb']:>7.1f} MB  {f['rows']:>9}  {f['peak_rss_mib']:>6.1f} MiB  "
              f"{f['exit']}")
    ratio = figures[-1]["peak_rss_mib"] / figures[0]["peak_rss_mib"]
    print(f"import only: {base:.1f} MiB; peak RSS {figures[-1]['size_mb']:.0f} MB / "
          f"{figures[0]['size_mb']:.0f} MB: {ratio:.2f}x")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps(
            {"figures": figures, "import_only_mib": base, "ratio": round(ratio, 3)},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
