"""``titan-rocm check-log LOG... [--format auto|torchtitan|megatron] [--json]``."""

from __future__ import annotations

import argparse
import json

from titan_rocm.cli import CommandError
from titan_rocm.logs.check import check_file, combined_exit_code
from titan_rocm.logs.parse import FORMATS

HELP = (
    "Require every loss and grad norm logged by a TorchTitan or Megatron-LM training log to "
    "be finite, and say whether the run finished. Exit 0: at least one training step, all "
    "finite (a log that ends in a crash after finite steps is reported as incomplete, still "
    "0); 1: a non-finite value or the divergence guard's stop message; 2: nothing to check "
    "(unreadable or not a regular file, no metric line, no training step, or the middle of "
    "a line over 1 MiB not read, or a numerics audit verdict line cut or split by other "
    "output); 3 with --require-complete: every value finite, but a run did not finish or its "
    "log shows no end of training; 4: every value finite, but the in-training numerics audit "
    "flagged a step (a quarantine included)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``check-log``."""
    parser.add_argument("logs", nargs="+", metavar="LOG", help="training log file(s)")
    parser.add_argument(
        "--format", choices=FORMATS, default="auto",
        help="log format (default: auto, both TorchTitan and Megatron-LM lines)",
    )
    parser.add_argument(
        "--require-complete", action="store_true",
        help="exit 3 when a log ends in a crash after finite steps (incomplete) or shows no "
        "end of training ('Training completed', 'Process group destroyed', '[after training "
        "is done]') after its last step, so a CI step fails on a run that did not finish "
        "(default: 0, the report says so)",
    )
    parser.add_argument(
        "--json", action="store_true",
        help="print one JSON object: per file steps parsed, first bad step, values, format",
    )


def run(args: argparse.Namespace) -> int:
    """Check every log; print the verdicts; return the exit code. A LOG of ``-`` is refused."""
    if "-" in args.logs:
        # check_file reads regular files only; '-' would be looked up as a file name.
        raise CommandError("LOG '-' is not valid: check-log does not read standard input; "
                           "accepted: the path of a log file (save the stream first, e.g. "
                           "... | tee train.log; a file named - is ./-)")
    results = [check_file(path, args.format) for path in args.logs]
    code = combined_exit_code(results, args.require_complete)
    if args.json:
        print(json.dumps(
            {"exit_code": code, "files": [r.to_dict() for r in results]},
            indent=2, allow_nan=False,
        ))
    else:
        for result in results:
            print("\n".join(result.lines()))
    return code
