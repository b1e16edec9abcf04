"""``titan-rocm bench-summary LOG... [--warmup N] [--format ...] [--json]``."""

from __future__ import annotations

import argparse
import json

from titan_rocm.logs.parse import FORMATS, UnreadableLog, parse_file
from titan_rocm.logs.summary import DEFAULT_WARMUP, summarize
from titan_rocm.numbers import STEPS

HELP = (
    "Throughput summary of one training run for publishing: median/min/max tokens/s, TFLOP/s, "
    "MFU (or Megatron-LM iteration time) over the steps after warm-up, memory peak, steps "
    "parsed. A run that diverged, did not finish (its log ends in a crash, or has no training "
    "step) or logged a non-finite or negative figure is 'valid: false' with the reason and "
    "gets no figure. Several LOGs are pooled as one run (e.g. one file per rank). Exit 0 "
    "valid, 1 not a valid benchmark, 2 nothing to summarize."
)


warmup_arg = STEPS.arg("--warmup")
"""``--warmup``: an integer >= 0 (argparse type; also used by ``compare``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bench-summary``."""
    parser.add_argument("logs", nargs="+", metavar="LOG", help="log file(s) of one run")
    parser.add_argument(
        "--warmup", type=warmup_arg, default=DEFAULT_WARMUP, metavar="N",
        help=f"leave steps <= N out of the throughput figures (default {DEFAULT_WARMUP})",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="auto",
        help="log format (default: auto, both TorchTitan and Megatron-LM lines)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    """Summarize the run; print it; return 0 (valid), 1 (not valid) or 2 (nothing to sum)."""
    logs, unreadable = [], []
    for path in args.logs:
        try:
            # Lean: memory grows with the distinct steps and figure values, not the lines.
            logs.append(parse_file(path, args.format, lean=True, warmup=args.warmup))
        except UnreadableLog as exc:
            unreadable.append(exc)
    summary = summarize(logs, args.warmup, unreadable)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, allow_nan=False))
    else:
        print("\n".join(summary.lines()))
    return summary.exit_code
