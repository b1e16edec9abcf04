"""``titan-rocm audit``: a compiled job checked block by block against eager and high-precision
replays of its own inputs (docs/numerics-audit.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from titan_rocm.cli import CommandError, as_command_error
from titan_rocm.numbers import Bounds

HELP = (
    "Check a compiled job block by block: build the job's own trainer (model, converters, "
    "parallelism, compile, data), run one micro-batch's step as configured while recording "
    "what enters and leaves each block, then replay every block alone from those inputs, "
    "eager at the job's precision and in high precision, and compare its outputs and "
    "gradients. Exit 0 ok, 1 flagged, 2 bad input or cannot run."
)

EPILOG = (
    "The job: --job.config_file X.toml (TorchTitan 0.2.2) or --module M --config F "
    "(TorchTitan 0.3.0, e.g. --module titan_rocm.torchtitan.configs --config llama3_debugmodel). "
    "Every other option is TorchTitan's (--model.converters rocm, --compile.enable, "
    "--rocm.numerics_audit_fudge 3, ...). Under torchrun every rank audits its shards and "
    "all ranks share one verdict; rank 0 prints. The job's trainer needs the job's GPUs: run "
    "it where the job trains. Without a GPU (TorchTitan 0.2.2): --trainer cpu builds the "
    "job's own model on the CPU (titan_rocm/adapters/tt022/cpu_trainer.py; random tokens, no "
    "autocast), --trainer cpu-tiny its architecture at two blocks of 64, e.g. titan-rocm "
    "audit --job.config_file configs/llama3_debug.toml --trainer cpu-tiny."
)

PASSTHROUGH = True

PROG = "titan-rocm audit"
TOKENS = Bounds(int, 1, 10**12)
CHUNKS = Bounds(int, 1, 10**9)
CORRUPT_ENV = "TITAN_ROCM_DEBUG_CORRUPT"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``titan-rocm audit``; unknown options are TorchTitan's."""
    parser.epilog = EPILOG
    parser.allow_abbrev = False
    parser.add_argument(
        "--job.config_file", "--job.config-file", dest="config_file", metavar="FILE",
        help="the job's TOML file (TorchTitan 0.2.2's flag, passed on to it)",
    )
    parser.add_argument(
        "--tokens", metavar="N", type=TOKENS.arg("--tokens"),
        help="audit only the first N tokens of the micro-batch (whole rows while they fit; "
        "default: the whole micro-batch)",
    )
    parser.add_argument(
        "--reference-chunks", metavar="N", type=CHUNKS.arg("--reference-chunks"),
        help="replay each block in N runs of whole rows (the job pass always runs the whole "
        "micro-batch; default: whole where the estimate says it fits, and in one process "
        "more runs after running out of memory)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="FILE",
                        help="draw each tensor's error over its threshold (PNG, or SVG by "
                        "the suffix)")
    parser.add_argument(
        "--trainer", metavar="MODULE:CLASS", default=None,
        help="TorchTitan 0.2.2: the Trainer class to build (default: TorchTitan's; a "
        "subclass your job launches with, e.g. mypkg.train:MyTrainer), or without a GPU: "
        "cpu (the job's model on the CPU) or cpu-tiny (its architecture, two blocks of 64)",
    )


def _rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def error_report(message: str, code: int) -> dict[str, Any]:
    """The ``--json`` object of an audit that could not run: the report's every key, empty."""
    from titan_rocm.numerics.result import error_dict

    return {**error_dict(message), "exit_code": code}


def _emit(args: argparse.Namespace, result: dict[str, Any]) -> int:
    code = int(result["exit_code"])
    if result["world_size"] > 1:  # every rank says it: one shared verdict is checkable
        print(f"{PROG}: rank {_rank()} of {result['world_size']}: verdict {result['verdict']}",
              file=sys.stderr)
    if _rank() != 0:
        return code
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        from titan_rocm.numerics.report import format_report

        print(format_report(result))
    return code


def _install_fault(model_parts: list[Any]) -> None:
    """The test fault, when ``TITAN_ROCM_DEBUG_CORRUPT`` asks (the test-only module is not imported
    otherwise)."""
    if not os.environ.get(CORRUPT_ENV, "").strip():
        return
    from titan_rocm.testing import corrupt

    with as_command_error(corrupt.CorruptSpecError):
        corrupt.install(model_parts)


def _log_to_stderr() -> None:
    """The job's INFO lines on stderr, because TorchTitan's ``init_logger`` writes to stdout, where
    ``--json`` prints."""
    import logging

    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        "[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def _audit(args: argparse.Namespace) -> dict[str, Any]:
    from titan_rocm import adapters
    from titan_rocm.adapters.common import AuditRequest

    request = AuditRequest(
        passthrough=list(args.passthrough), config_file=args.config_file,
        trainer=args.trainer, tokens=args.tokens, chunks=args.reference_chunks,
        before_job=_install_fault)
    with as_command_error(adapters.NoAdapter):
        adapter = adapters.installed()
    _log_to_stderr()
    out = adapter.audit(request).to_dict()
    if args.plot and _rank() == 0:
        from titan_rocm.numerics.report import plot

        try:
            plot(out, args.plot)
        except OSError as exc:
            raise CommandError(f"--plot {args.plot!r}: {exc}") from None
    return out


def check_plot(text: str | None) -> None:
    """``--plot``'s file, directory and matplotlib, checked before the audit builds anything, so a
    picture that cannot be drawn is refused in seconds, not minutes."""
    if text is None:
        return
    from titan_rocm.logs.compare import CompareError
    from titan_rocm.logs.plot import plot_path, require_matplotlib

    with as_command_error(CompareError):
        plot_path(text)
        require_matplotlib()


def run(args: argparse.Namespace) -> int:
    """Audit the job; print the report (or JSON); 0 ok, 1 flagged. CommandError on rank 0 when it
    cannot run (the other ranks return 2 quietly)."""
    from titan_rocm.adapters.common import one_line
    from titan_rocm.numerics.result import AuditError

    check_plot(args.plot)
    error = None
    try:
        result = _audit(args)
    except (AuditError, CommandError) as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - one sentence and the JSON, never a traceback
        error = f"the audit failed: {one_line(exc)}"
    finally:
        _close()
    if error is None:
        return _emit(args, result)
    if _rank() != 0:  # one sentence and one JSON object: rank 0's
        return 2
    raise CommandError(error)


def _close() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
