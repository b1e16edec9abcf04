"""``check-log`` and ``bench-summary`` on every run's log of stored GPU results, one line each.

    python benchmarks/check_result_logs.py benchmarks/results/2026-11-30-h200-b/*/

Each DIR holds ``logs.tar.gz`` (as written by ``benchmarks/gpu_validation.py`` or the
``launcher`` run of ``benchmarks/divergence_guard_overhead.py``). Runs meant to diverge (NaN
injection) must fail both: that is their pass. Exit 1 if any other log is not finite/valid.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from titan_rocm.logs.check import check_file  # noqa: E402
from titan_rocm.logs.parse import parse_file  # noqa: E402
from titan_rocm.logs.summary import summarize  # noqa: E402

EXPECTED_TO_DIVERGE = ("nan_step", "inject_nan")


def main() -> int:
    """Print one line per log; exit 1 when a log that should be clean is not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    parser.add_argument("--warmup", type=int, default=10,
                        help="bench-summary warm-up steps (default 10: the first interval)")
    args = parser.parse_args()
    bad = 0
    rows: list[tuple[str, str]] = []  # (result/log, the rest): printed once all are known
    missing = None
    for directory in args.dirs:
        archive = directory / "logs.tar.gz"
        if not archive.is_file():
            missing = directory
            break
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            for log in sorted(Path(tmp).rglob("*.log")):
                check = check_file(log)
                summary = summarize([parse_file(log)], warmup=args.warmup)
                tps = summary.stats.get("tps") if summary.valid and summary.stats else None
                diverge = any(k in log.name for k in EXPECTED_TO_DIVERGE)
                ok = (check.exit_code == 1 and not summary.valid) if diverge else (
                    check.exit_code == 0 and summary.valid)
                bad += not ok
                memory = summary.memory_peak_gib
                rows.append((directory.name + "/" + log.name,
                             f"{check.status:<10} "
                             f"{'valid' if summary.valid else 'invalid':<14} "
                             f"{f'{tps.median:,.0f}' if tps else '-':>10}   "
                             f"{f'{memory:.2f} GiB' if memory is not None else '-'}"
                             f"{'   (meant to diverge: ok)' if diverge and ok else ''}"
                             f"{'   UNEXPECTED' if not ok else ''}"))
    width = max([62, *(len(name) for name, _ in rows)])  # fits the longest name
    print(f"{'result/log':<{width}} {'check-log':<10} {'bench-summary':<14} median tps   memory")
    for name, rest in rows:
        print(f"{name:<{width}} {rest}")
    if missing is not None:
        print(f"{missing}: no logs.tar.gz", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
