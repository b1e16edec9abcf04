"""The stock-vs-``rocm_on`` pictures of docs/performance.md, from the stored H200 logs.

    python -m benchmarks.compare_figures            # writes docs/images/compare-*.png

For llama3 1.5B, qwen3 1.7B and deepseek_v3 3.9B, the throughput suite ran each variant twice
(mirrored passes, ``@1`` and ``@2``). Each picture is ``titan-rocm compare`` with stock's first
run as the baseline, stock's second run as the one repeat that makes the noise band, and both
``rocm_on`` runs compared with it (warm-up 10: the suite's medians leave out the first
interval). The report of each comparison is printed. CPU only; a few seconds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.harness import REPO, extracted
from titan_rocm.logs.compare import compare, load_run
from titan_rocm.logs.plot import plot

RESULTS = REPO / "benchmarks" / "results"
FIGURES: dict[str, tuple[str, str]] = {
    "llama3": ("2026-11-30-h200-b/throughput-llama3-1b", "llama3_1b"),
    "qwen3": ("2026-11-30-h200-b/throughput-qwen3-1.7b", "qwen3_1.7b"),
    "deepseek_v3": ("2026-11-30-h200-c/throughput-deepseek_v3-4b", "deepseek_v3_4b"),
}
"""Picture name -> (stored result folder, log prefix)."""
WARMUP = 10
SIZE = (1000, 900)


def make(name: str, out_dir: Path) -> tuple[Path, list[str], int]:
    """Draw one picture into ``out_dir``; return its path, the report and the exit code."""
    folder, prefix = FIGURES[name]
    with extracted(RESULTS / folder) as tmp:
        logs = tmp / "logs"

        def run(variant: str, label: str):
            return load_run(logs / f"{prefix}_{variant}.log", label, warmup=WARMUP)

        comparison = compare(
            run("stock@1", "stock (run 1)"),
            [run("rocm_on@1", "rocm_on (run 1)"), run("rocm_on@2", "rocm_on (run 2)")],
            [run("stock@2", "stock (run 2)")],
            warmup=WARMUP,
        )
        path = out_dir / f"compare-{name}.png"
        plot(comparison, path, size=SIZE)
        # The temporary folder's path means nothing to a reader: name the stored archive.
        report = [line.replace(f"{logs}/", f"{folder}/logs.tar.gz: ")
                  for line in comparison.lines()]
        return path, report, comparison.exit_code


def main() -> int:
    """Draw every picture; print each report; exit 0 (the verdicts are reported, not judged)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images",
                        help="folder for the pictures (default docs/images)")
    parser.add_argument("--only", choices=sorted(FIGURES), action="append",
                        help="draw only this picture (repeatable)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or FIGURES:
        path, report, code = make(name, args.out)
        print(f"## {name}: {path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
              f"({path.stat().st_size // 1024} KiB; compare would exit {code})")
        print("\n".join(report))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
