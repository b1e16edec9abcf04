"""``check-log`` and ``bench-summary`` on every run's log of stored GPU results, one line each.

    python -m benchmarks.check_result_logs benchmarks/results/2026-11-30-h200*/*/

Each DIR holds ``logs.tar.gz`` (as a benchmark's ``--out`` writes it, or the
``launcher`` run of ``benchmarks/divergence_guard_overhead.py``). Every row states what it is
expected to be, and the script checks it:

- a clean run: verdict ``ok``, check-log exit 0, bench-summary ``valid``;
- a run meant to diverge (NaN injection, ``nan_step`` / ``inject_nan`` in its name): verdict
  ``diverged``, check-log exit 1, bench-summary ``invalid``: that is its pass;
- a run known to have failed at start-up (:data:`KNOWN_STARTUP_FAILURES`, with the reason):
  verdict ``incomplete`` with no training step, check-log exit 2, bench-summary ``invalid``;
- a log that is not a training run (a tune phase, a probe) or a known failure
  (:data:`NOT_TRAINING_RUNS`): what its entry says.

Exit 0 when every row is as expected, 1 when one is not (marked UNEXPECTED), 2 when a DIR has
no ``logs.tar.gz``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.harness import extracted
from titan_rocm.logs.check import check_parsed
from titan_rocm.logs.parse import parse_file
from titan_rocm.logs.summary import summarize

EXPECTED_TO_DIVERGE = ("nan_step", "inject_nan")
KNOWN_STARTUP_FAILURES: dict[str, str] = {
    f"2026-11-30-h200/two-lane/{model}_stock.log": "known start-up failure, KeyError ''"
    for model in ("llama3", "qwen3", "deepseek_v3")
}
"""Runs of the stored results that never trained, keyed ``batch/folder/log``: the first
harness passed ``--model.converters ""`` to stock runs, which TorchTitan 0.2.2 reads as
``[""]`` and fails on at start-up (``KeyError: ''``). No figure uses them."""


_TUNE = "2026-11-30-h200-d/validated-tuning"
NOT_TRAINING_RUNS: dict[str, tuple[str, int, bool, str]] = {
    **{f"{_TUNE}{suffix}/{log}": ("empty", 2, False, "a tune log: no training step")
       for suffix in ("", "-wrong-config")
       for log in ("run_killed.log", "run_resumed.log", "table.log")},
    **{f"{_TUNE}{suffix}/collect.log": ("ok", 0, False, "tune collect: one step, no benchmark")
       for suffix in ("", "-wrong-config")},
    "2026-11-30-h200-d/tt030-probe/probe.log": (
        "empty", 2, False, "TorchTitan 0.3.0's probe: its trainer does not import on torch 2.11"),
    "2026-11-30-h200-d/mla-varlen-attempt/varlen.log": (
        "empty", 2, False, "known failure: the stand-in backward hung (docs/mla-ck-backward.md)"),
    # The numerics audit's GPU proof: `titan-rocm audit` runs no training step; its six-step
    # training runs are shorter than bench-summary's warm-up.
    **{f"2026-12-01-h200/numerics-audit-{call}/{model}_{kind}.log": verdict
       for call in (1, 2)
       for model in ("llama3_1b", "qwen3_1.7b", "deepseek_v3_4b")
       for kind, verdict in (
           ("audit", ("empty", 2, False, "an audit: no training step")),
           ("train", ("ok", 0, False, "six steps for the audit's cost: under the warm-up")))},
    # An audit whose torchrun exits non-zero (1: flagged, 2: refused) ends in torchrun's
    # ChildFailedError: check-log reads that as a crash after no step.
    **{f"2026-12-01-h200/numerics-audit-{key}": (
        "incomplete", 2, False, f"an audit that exits {code}: torchrun's ChildFailedError")
       for key, code in (("1/deepseek_v3_4b_audit.log", 2),
                         ("2/llama3_1b_audit_corrupt.log", 1))},
    **{f"2026-12-01-h200/audit-table-attempt/llama3_1b_full_audit_{kind}.log": (
        "incomplete", 2, False, "an audit refused (exit 2): out of memory at the table's whole "
        "8 x 2048 micro-batch, before runs of rows (numerics-audit.md)")
       for kind in ("aten", "table")},
    # The same two audits with the passes in runs of rows: both ok (exit 0), no step. On
    # torch 2.11 Inductor logs a traceback for every graph when a GEMM table is on (it cannot
    # pickle the choices handler for its cache key), and call 3's audits logged torch's "CUDA
    # out of memory" words when the reference ran again in runs of rows (reworded since):
    # check-log reads either as a crash before the first step.
    "2026-12-01-h200/audit-table-2/llama3_1b_full_audit_aten.log": (
        "empty", 2, False, "an audit: no training step"),
    **{f"2026-12-01-h200/audit-table-{key}.log": (
        "incomplete", 2, False, f"an audit (exit 0): no training step; {why}")
       for key, why in (
           ("2/llama3_1b_full_audit_table", "Inductor's cache-key traceback (table on)"),
           ("3/llama3_1b_full_audit_aten", "the logged out-of-memory retry"),
           ("3/llama3_1b_full_audit_table", "Inductor's cache-key traceback (table on)"))},
    "2026-12-01-h200/numerics-audit-1/llama3_1b_audit_corrupt.log": (
        "empty", 2, False, "an audit: no training step (the fault passed: numerics-audit.md)"),
}
"""Logs of the stored results that are not training runs, or are known not to have trained,
keyed ``batch/folder/log``, with what each must show."""


def expectation(key: str, name: str) -> tuple[str, int, bool, str]:
    """(verdict status, check-log exit, bench-summary valid, note) a log must show."""
    if key in NOT_TRAINING_RUNS:
        return NOT_TRAINING_RUNS[key]
    if key in KNOWN_STARTUP_FAILURES:
        return "incomplete", 2, False, KNOWN_STARTUP_FAILURES[key]
    if any(k in name for k in EXPECTED_TO_DIVERGE):
        return "diverged", 1, False, "meant to diverge"
    return "ok", 0, True, ""


def main() -> int:
    """Print one line per log; exit 1 when a log is not what its row expects."""
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
        with extracted(directory) as tmp:
            for log in sorted(tmp.rglob("*.log")):
                parsed = parse_file(log)
                check = check_parsed(parsed)
                summary = summarize([parsed], warmup=args.warmup)
                assert check.verdict is not None
                tps = summary.stats.get("tps") if summary.valid and summary.stats else None
                key = f"{directory.resolve().parent.name}/{directory.name}/{log.name}"
                status, code, valid, note = expectation(key, log.name)
                ok = (check.verdict.status, check.exit_code, summary.valid) == (
                    status, code, valid)
                bad += not ok
                memory = summary.memory_peak_gib
                said = f"   ({note}: as expected)" if note and ok else ""
                if not ok:
                    said = f"   UNEXPECTED (expected {status}, check-log exit {code})"
                rows.append((directory.name + "/" + log.name,
                             f"{check.verdict.label:<20} {check.exit_code:^9} "
                             f"{'valid' if summary.valid else 'invalid':<14} "
                             f"{f'{tps.median:,.0f}' if tps else '-':>10}   "
                             f"{f'{memory:.2f} GiB' if memory is not None else '-':<9}"
                             f"{said}".rstrip()))
    width = max([62, *(len(name) for name, _ in rows)])  # fits the longest name
    print(f"{'result/log':<{width}} {'verdict':<20} check-log {'bench-summary':<14} "
          "median tps   memory")
    for name, rest in sorted(rows):  # sorted here: a shell's glob order depends on its locale
        print(f"{name:<{width}} {rest}")
    if missing is not None:
        print(f"{missing}: no logs.tar.gz", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
