"""``titan-rocm plan``: how fast it refuses a bad flag or file, against the full plan.

    python -m benchmarks.plan_refusal_time [--repeat 3] [--json]

Runs, side by side in one run on this machine (CPU only), each refusal that needs no torch
(a missing TOML, ``--world-size 0``, world-size flags that disagree, an unknown ``--arch``,
no job at all) and the full plan of ``configs/llama3_debug.toml``, each as a fresh
``python -m titan_rocm.cli`` process (what a user's shell starts), ``--repeat`` times, and
prints the median wall time of each and its ratio to the full plan. Target: every refusal
under 2 s (issue 25, item 2: they took 12-22 s when torch and TorchTitan loaded first).
Each refusal must exit 2 and the plan 0; a case that does not is reported, not timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks.harness import REPO

JOB = "configs/llama3_debug.toml"
TARGET_S = 2.0

CASES: dict[str, tuple[list[str], int]] = {
    "missing TOML": (["--job.config_file", "nope.toml"], 2),
    "--world-size 0": (["--world-size", "0", "--job.config_file", JOB], 2),
    "world-size flags disagree": (["--world-size", "8", "--nnodes", "2", "--nproc-per-node", "8",
                                   "--job.config_file", JOB], 2),
    "unknown --arch": (["--arch", "gfx9000", "--job.config_file", JOB], 2),
    "--aiter without --arch": (["--aiter", "main", "--job.config_file", JOB], 2),
    "no job": ([], 2),
    "full plan": (["--job.config_file", JOB], 0),
}
"""Name -> (plan's arguments, the exit code it must give)."""


def command(args: list[str]) -> list[str]:
    """The process a case starts."""
    return [sys.executable, "-m", "titan_rocm.cli", "plan", *args]


def time_case(args: list[str], expect: int) -> tuple[float, int]:
    """Wall seconds of one run of the case, and its exit code."""
    start = time.perf_counter()
    proc = subprocess.run(command(args), cwd=REPO, capture_output=True, timeout=600)
    return time.perf_counter() - start, proc.returncode


def analyse(times: dict[str, list[float]]) -> dict[str, dict[str, float | bool | None]]:
    """Median per case, its ratio to the full plan's, and whether a refusal met the target."""
    full = statistics.median(times["full plan"]) if times.get("full plan") else None
    out: dict[str, dict[str, float | bool | None]] = {}
    for name, values in times.items():
        median = statistics.median(values)
        out[name] = {
            "median_s": round(median, 3),
            "over_full_plan": round(median / full, 4) if full else None,
            "met": None if name == "full plan" else median < TARGET_S,
        }
    return out


def main() -> int:
    """Time every case; print the table (or JSON); exit 1 if a case gave the wrong code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {}
    wrong = []
    for _ in range(args.repeat):  # interleaved, so a drift of the machine hits every case
        for name, (plan_args, expect) in CASES.items():
            seconds, code = time_case(plan_args, expect)
            if code != expect:
                wrong.append(f"{name}: exit {code}, expected {expect}")
                continue
            times.setdefault(name, []).append(seconds)
    figures = analyse(times)
    if args.json:
        print(json.dumps({"figures": figures, "wrong_exit": wrong, "target_s": TARGET_S},
                         indent=2))
    else:
        for name, f in figures.items():
            met = "" if f["met"] is None else ("  target met" if f["met"] else "  NOT met")
            print(f"{name:<28} {f['median_s']:7.2f} s   x{f['over_full_plan']} of the full "
                  f"plan{met}")
        for line in wrong:
            print(f"wrong exit code: {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
