"""``titan-rocm compare``: training runs side by side against a baseline (docs/compare.md)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from titan_rocm.cli import CommandError, as_command_error
from titan_rocm.cli.bench_summary import warmup_arg
from titan_rocm.logs.compare import (
    DEFAULT_TOLERANCE_PCT,
    TOLERANCE,
    CompareError,
    Run,
    compare,
    load_run,
)
from titan_rocm.logs.parse import FORMATS, UnreadableLog
from titan_rocm.logs.plot import plot_path
from titan_rocm.logs.summary import DEFAULT_WARMUP
from titan_rocm.numbers import Bounds

HELP = (
    "Put training runs side by side: each OTHER log's loss and grad norm against the "
    "BASELINE's, step by step, judged against the noise band that repeat runs of the baseline "
    "job show (--noise); throughput ratio (median after warm-up, as bench-summary) and memory "
    "peak; a picture with --plot. A run that diverged or did not finish is named, never "
    "averaged in. Exit 0 every run within noise (without --noise: every run valid), 1 a run "
    "differs or is invalid, 2 bad input."
)

DEFAULT_SIZE = (1200, 1100)


PIXELS = Bounds(int, 200, 8000, unit="pixels")
_size = PIXELS.arg_many("--size", sep="x", form="WIDTHxHEIGHT (e.g. 1200x1100)", count=2)
_tolerance = TOLERANCE.arg("--tolerance")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``compare``."""
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="the baseline's log, then one log per run to compare with it")
    parser.add_argument(
        "--label", action="append", default=[], metavar="NAME",
        help="a name for each LOG in order (repeat the flag; default: the file names less "
             "the start and end they all share)")
    parser.add_argument(
        "--noise", action="extend", nargs="+", default=[], metavar="REPEAT",
        help="logs of the baseline job run again unchanged: their spread is the noise band")
    parser.add_argument(
        "--plot", metavar="FILE",
        help="draw loss, grad norm and relative difference to FILE (.png or .svg; "
             "needs matplotlib: pip install 'titan-rocm[plot]')")
    parser.add_argument(
        "--size", type=_size, default=DEFAULT_SIZE, metavar="WxH",
        help=f"picture size in pixels (default {DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]})")
    parser.add_argument("--log-y", action="store_true", help="draw the loss on a log scale")
    parser.add_argument(
        "--warmup", type=warmup_arg, default=DEFAULT_WARMUP, metavar="N",
        help=f"leave steps <= N out of the throughput medians (default {DEFAULT_WARMUP})")
    parser.add_argument(
        "--tolerance", type=_tolerance, default=DEFAULT_TOLERANCE_PCT, metavar="PCT",
        help="relative differences up to PCT percent are never a difference "
             f"(default {DEFAULT_TOLERANCE_PCT})")
    parser.add_argument(
        "--format", choices=FORMATS, default="auto",
        help="log format (default: auto, both TorchTitan and Megatron-LM lines)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


_SEPARATORS = "_-.@ "


def short_names(names: list[str]) -> list[str]:
    """Default labels: file names without the start and end they all share (``llama3_stock@1.log``
    -> ``stock@1``); the names as given when that would leave one empty or two alike."""
    if len(names) < 2:
        return [n.removesuffix(".log") or n for n in names]
    prefix = os.path.commonprefix(names)
    prefix = prefix[:max((prefix.rfind(c) + 1 for c in _SEPARATORS), default=0)]
    suffix = os.path.commonprefix([n[::-1] for n in names])[::-1]
    cuts = [i for i, ch in enumerate(suffix) if ch in _SEPARATORS]
    suffix = suffix[cuts[0]:] if cuts else ""
    short = [n[len(prefix):len(n) - len(suffix)] for n in names]
    if any(not x for x in short) or len(set(short)) < len(short):
        return names
    return short


def _labels(args: argparse.Namespace) -> list[str]:
    if len(args.label) > len(args.logs):
        raise CompareError(
            f"{len(args.label)} --label values for {len(args.logs)} LOG(s); accepted: at most "
            "one --label per LOG, in the order of the LOGs.")
    names = list(args.label) + short_names([Path(p).name for p in args.logs[len(args.label):]])
    if len(set(names)) < len(names):
        raise CompareError(
            f"the runs' names are not distinct ({', '.join(names)}); give each LOG its own "
            "--label.")
    return names


def run(args: argparse.Namespace) -> int:
    """Compare the runs; print the report; return 0, 1 or 2."""
    with as_command_error(CompareError, UnreadableLog):
        if len(args.logs) < 2:
            raise CompareError(
                "compare needs a baseline LOG and at least one other LOG to compare with it.")
        labels = _labels(args)
        picture = plot_path(args.plot) if args.plot else None
        if picture is not None:
            from titan_rocm.logs.plot import require_matplotlib

            require_matplotlib()

        def load(path: str, label: str) -> Run:
            return load_run(path, label, args.format, args.warmup)

        runs = [load(p, name) for p, name in zip(args.logs, labels, strict=True)]
        repeats = [load(p, f"repeat {i}: {Path(p).name}") for i, p in
                   enumerate(args.noise, start=1)]
    comparison = compare(runs[0], runs[1:], repeats, args.tolerance, args.warmup)
    if picture is not None:
        from titan_rocm.logs.plot import plot

        try:
            plot(comparison, picture, size=args.size, log_y=args.log_y)
        except OSError as exc:
            raise CommandError(f"cannot write {picture}: {exc.strerror or exc}.") from None
    if args.json:
        print(json.dumps(comparison.to_dict(), indent=2, allow_nan=False))
    else:
        print("\n".join(comparison.lines()))
        if picture is not None:
            print(f"picture: {picture}")
    return comparison.exit_code
