"""``titan-rocm audit``: the job's compiled gradients against eager references, per parameter.

Launched like training (``torchrun --nproc_per_node=N -m titan_rocm.cli audit
--job.config_file X.toml``; TorchTitan 0.3.0: ``... audit --module M --config F``; or alone
as one process). Builds the job's own trainer, takes
one micro-batch of its dataloader and runs no optimizer step, saves no checkpoint, writes
no file of the job (checkpointing, TensorBoard, W&B and profiling are turned off for the
audit). Exit codes: 0 ok, 1 a parameter or the loss flagged, 2 bad input or the audit cannot
run (one sentence), 130 interrupted. ``--json`` prints one object on every exit path
(rank 0). Docs: docs/numerics-audit.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

HELP = (
    "Prove a compiled job's gradients: build the job's own trainer (model, converters, "
    "parallelism, compile, data), run one micro-batch's forward and backward as configured, "
    "eager at the job's precision and eager in float64 (float32 under FSDP), and compare "
    "every parameter's gradient and the loss. Exit 0 ok, 1 flagged, 2 bad input or cannot run."
)

EPILOG = (
    "The job: --job.config_file X.toml (TorchTitan 0.2.2) or --module M --config F "
    "(TorchTitan 0.3.0, e.g. --module titan_rocm.torchtitan.configs --config llama3_debugmodel). "
    "Every other option is TorchTitan's (--model.converters rocm, --compile.enable, "
    "--rocm.numerics_audit_fudge 8, ...). Under torchrun every rank audits its shards and "
    "all ranks share one verdict; rank 0 prints."
)

PASSTHROUGH = True

PROG = "titan-rocm audit"
TRAINER_022 = "torchtitan.train:Trainer"
"""``--trainer``'s default (TorchTitan 0.2.2; a 0.3.0 config builds its own trainer)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``titan-rocm audit``; unknown options are TorchTitan's."""
    parser.epilog = EPILOG
    parser.allow_abbrev = False
    parser.add_argument(
        "--job.config_file", "--job.config-file", dest="config_file", metavar="FILE",
        help="the job's TOML file (TorchTitan's flag, passed on to it)",
    )
    parser.add_argument(
        "--tokens", metavar="N",
        help="audit only the first N tokens of the micro-batch (whole rows while they fit; "
        "default: the whole micro-batch)",
    )
    parser.add_argument(
        "--reference-chunks", metavar="N",
        help="run the eager and reference passes in N runs of whole rows, gradients "
        "accumulated (the job pass always runs the whole micro-batch; default: whole where "
        "it fits, and in one process more runs after running out of memory)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="FILE",
                        help="draw each parameter's error ratio (PNG, or SVG by the suffix)")
    parser.add_argument(
        "--trainer", metavar="MODULE:CLASS", default=TRAINER_022,
        help="the Trainer class to build (default: TorchTitan's; a subclass your job "
        "launches with, e.g. mypkg.train:MyTrainer)",
    )


class BadInput(Exception):
    """Exit 2 with this sentence."""


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0") or 0)


def _emit(args: argparse.Namespace, result: dict[str, Any]) -> int:
    code = int(result["exit_code"])
    if result["world_size"] > 1:  # every rank says it: one shared verdict is checkable
        print(f"{PROG}: rank {_rank()} of {result['world_size']}: verdict {result['verdict']}",
              file=sys.stderr)
    if _rank() != 0:
        return code
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    if code == 2:
        print(f"{PROG}: {result['error']}", file=sys.stderr)
    elif not args.json:
        from titan_rocm.numerics.report import format_report

        print(format_report(result))
    return code


def _trainer_class(spec: str) -> type:
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise BadInput(f"--trainer {spec!r} is not MODULE:CLASS (e.g. torchtitan.train:Trainer)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
        from titan_rocm.adapters.common import one_line as _one_line

        raise BadInput(f"--trainer {spec!r}: cannot import {module_name} ({_one_line(exc)})"
                       ) from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise BadInput(f"--trainer {spec!r}: {module_name} has no class {class_name}")
    return cls


def _quiet_job(job_config: Any) -> None:
    """Nothing of the job is written: no checkpoint, metrics files, profiles or snapshots."""
    for section, key in (("checkpoint", "enable"), ("metrics", "enable_tensorboard"),
                         ("metrics", "enable_wandb"), ("profiling", "enable_profiling"),
                         ("profiling", "enable_memory_snapshot"), ("metrics", "save_tb_folder")):
        obj = getattr(job_config, section, None)
        if obj is not None and isinstance(getattr(obj, key, None), bool):
            setattr(obj, key, False)


def _tokens(args: argparse.Namespace) -> int | None:
    if args.tokens is None:
        return None
    tokens = int(args.tokens) if args.tokens.strip().isdigit() else 0
    if tokens < 1:
        raise BadInput(f"--tokens {args.tokens} is not valid; accepted: a whole number >= 1")
    return tokens


def _chunks(args: argparse.Namespace) -> int | None:
    if args.reference_chunks is None:
        return None
    text = args.reference_chunks.strip()
    chunks = int(text) if text.isdigit() else 0
    if chunks < 1:
        raise BadInput(f"--reference-chunks {args.reference_chunks} is not valid; accepted: "
                       "a whole number >= 1 (at most the micro-batch's rows)")
    return chunks


def _audit_022(args: argparse.Namespace) -> dict[str, Any]:
    from titan_rocm.adapters.tt022.preflight import StartupError, parse_config
    from titan_rocm.numerics.audit import audit_022

    passthrough = list(args.passthrough)
    if args.config_file is not None:
        passthrough = ["--job.config_file", args.config_file, *passthrough]
    tokens = _tokens(args)
    chunks = _chunks(args)
    try:
        job_config = parse_config(passthrough, launcher="titan-rocm", prog=PROG)
    except StartupError as exc:
        raise BadInput(str(exc)) from None
    settings = _settings(job_config)
    cls = _trainer_class(args.trainer)
    _quiet_job(job_config)
    return _audit_job(args, lambda: cls(job_config), audit_022, settings, tokens, chunks)


def _audit_030(args: argparse.Namespace) -> dict[str, Any]:
    """TorchTitan 0.3.0: ``--module M --config F [flags]``, the config's own trainer class."""
    from titan_rocm.adapters.tt030.audit import audit_030, quiet_job
    from titan_rocm.adapters.tt030.plan import PlanError, parse_job

    if args.config_file is not None:
        raise BadInput("--job.config_file is TorchTitan 0.2.2's; torchtitan 0.3.0 is "
                       "installed: audit a 0.3.0 job with --module M --config F")
    if args.trainer != TRAINER_022:
        raise BadInput(f"--trainer {args.trainer!r} is TorchTitan 0.2.2's; on 0.3.0 the "
                       "config function's Trainer.Config builds its own trainer")
    tokens = _tokens(args)
    chunks = _chunks(args)
    try:
        config = parse_job(list(args.passthrough))
    except PlanError as exc:
        raise BadInput(str(exc)) from None
    settings = _settings(config)
    quiet_job(config)
    return _audit_job(args, config.build, audit_030, settings, tokens, chunks)


def _settings(config: Any) -> Any:
    from titan_rocm.numerics.stats import AuditSettings

    try:
        return AuditSettings.of(getattr(config, "rocm", None))
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _audit_job(args: argparse.Namespace, build: Any, audit: Any, settings: Any,
               tokens: int | None, chunks: int | None) -> dict[str, Any]:
    """Build the trainer, take one micro-batch, audit it, draw the plot: either generation."""
    from titan_rocm.adapters.common import one_line as _one_line
    from titan_rocm.adapters.tt022.train import LaunchError, single_process_environment
    from titan_rocm.numerics.audit import AuditError

    try:
        single_process_environment()
    except LaunchError as exc:
        raise BadInput(str(exc)) from None
    _log_to_stderr()
    import titan_rocm  # noqa: F401 - registers the converters

    try:
        trainer = build()
    except Exception as exc:  # noqa: BLE001 - any failure of the job's start-up is reported
        raise BadInput(f"the job cannot start: {_one_line(exc)}") from None
    try:
        input_dict, labels = next(iter(trainer.dataloader))
    except Exception as exc:  # noqa: BLE001
        raise BadInput(f"the job's dataloader gave no batch: {_one_line(exc)}") from None
    try:
        result = audit(trainer, input_dict, labels, settings, tokens, chunks)
    except AuditError as exc:
        raise BadInput(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the job's own forward/backward failed
        raise BadInput(f"the job's forward and backward failed: {_one_line(exc)}") from None
    out = result.to_dict()
    if args.plot and _rank() == 0:
        from titan_rocm.logs.plot import MissingMatplotlib
        from titan_rocm.numerics.report import plot

        try:
            plot(out, args.plot)
        except (MissingMatplotlib, OSError) as exc:
            raise BadInput(f"--plot {args.plot!r}: {exc}") from None
    return out


def _log_to_stderr() -> None:
    """The job's INFO lines (titan-rocm's among them: which workarounds applied, and why one
    did not) on stderr in TorchTitan's format, as training shows them; TorchTitan's own
    ``init_logger`` writes to stdout, where ``--json`` prints. A handler already there (a
    test's, the user's) is left alone."""
    import logging

    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        "[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    """Audit the job; print the table (or JSON); 0 ok, 1 flagged, 2 cannot run."""
    from titan_rocm import torchtitan_version
    from titan_rocm.numerics.audit import error_dict

    world = 1
    try:
        tt030 = torchtitan_version.series() == "0.3"
        result = _audit_030(args) if tt030 else _audit_022(args)
    except BadInput as exc:
        result = error_dict(str(exc), world)
    except Exception as exc:  # noqa: BLE001 - one sentence and the JSON, never a traceback
        from titan_rocm.adapters.common import one_line as _one_line

        result = error_dict(f"the audit failed: {_one_line(exc)}", world)
    finally:
        _close()
    return _emit(args, result)


def _close() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
