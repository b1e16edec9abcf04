"""``titan-rocm tune``: validated GEMM tuning for a TorchTitan job (docs/validated-tuning.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from titan_rocm.cli import CommandError, as_command_error
from titan_rocm.numbers import DEVICES, Bounds, argparse_type

HELP = "validated GEMM tuning: collect a job's GEMMs, check and time every kernel, build a table"
PASSTHROUGH = True  # collect hands TorchTitan's flags on


TIMEOUT = Bounds(float, 0, 86400, low_open=True, unit="seconds")
COMPILE_TIMEOUT = Bounds(float, 0, 7 * 86400, low_open=True, unit="seconds")
FUDGE = Bounds(float, 0, 1000, low_open=True)
MIN_SPEEDUP = Bounds(float, 0, 1000, low_open=True)
GEMM_BACKENDS: tuple[str, ...] = (
    "ATEN", "TRITON", "CPP", "CK", "CKTILE", "CUTLASS", "CUTEDSL", "NVGEMM")
"""The backends Inductor's ``max_autotune_gemm_backends`` names (torch 2.13.0); any other name would
silently enumerate nothing."""


def _backends(text: str) -> str:
    names = [n.strip().upper() for n in text.split(",")]
    bad = [n for n in names if n not in GEMM_BACKENDS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not valid; accepted: a comma-separated list of "
            f"{', '.join(GEMM_BACKENDS)}")
    return ",".join(names)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tune`` actions to ``parser``."""
    from titan_rocm.tuner.runner import parse_gpus  # torch-free

    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    collect = actions.add_parser(
        "collect", help="record every GEMM problem of one step of the job",
        description="Run one step of the job with every GEMM compiled by ATen, and record the "
        "problems Inductor lowers. The job is named as TorchTitan takes it: --job.config_file "
        "X.toml [flags] (TorchTitan 0.2.2) or --module M --config F [flags] (TorchTitan 0.3.0; "
        "the job must run titan-rocm: rocm(cfg), --module titan_rocm.torchtitan.configs, or "
        "the override entry). `titan-rocm plan --help-torchtitan` lists TorchTitan's flags "
        "(0.3.0: with the job's --module M --config F).")
    collect.add_argument("-o", "--output", type=Path, required=True, metavar="PROBLEMS",
                         help="problems file to write (JSON lines)")
    collect.add_argument("--trainer", metavar="MODULE:CLASS",
                         help="TorchTitan 0.2.2: the trainer class (default "
                         "torchtitan.train:Trainer, which needs a GPU; a fork's, or one that "
                         "runs on CPU); 0.3.0 jobs build the trainer their config names")

    run = actions.add_parser(
        "run", help="check and time every candidate of every problem (resumable)",
        description="Check every candidate kernel of every problem against a float64 "
        "reference in a crash-isolated process, time the ones that pass; append to RESULTS "
        "and resume it when it exists.")
    run.add_argument("problems", type=Path, metavar="PROBLEMS")
    run.add_argument("-o", "--output", type=Path, required=True, metavar="RESULTS")
    run.add_argument("--gpus", type=argparse_type(parse_gpus, "--gpus", DEVICES), default="all",
                     help="all (default) or device indices such as 0,1")
    run.add_argument("--timeout", type=TIMEOUT.arg("--timeout"), default=30.0, metavar="S",
                     help="seconds a candidate may take to run once, and to be timed "
                     "(default 30)")
    run.add_argument("--compile-timeout", type=COMPILE_TIMEOUT.arg("--compile-timeout"),
                     default=900.0, metavar="S",
                     help="seconds to compile a problem's candidates or load one (default 900)")
    run.add_argument("--search-space", choices=("default", "exhaustive"), default="default",
                     help="Inductor's GEMM search space (max_autotune_gemm_search_space)")
    run.add_argument("--fudge", type=FUDGE.arg("--fudge"), default=3.0,
                     help="tolerance = FUDGE x max(ATen's own error, dtype default) (default 3)")
    run.add_argument("--backends", type=_backends, default="ATEN,TRITON",
                     help="Inductor GEMM backends to enumerate (default ATEN,TRITON; a table "
                     "only holds those; ATEN,CPP lets the CPU tests see two candidates)")
    run.add_argument("--retry-quarantined", action="store_true",
                     help="run the quarantined tasks again (started twice without a result: "
                     "two kills while they ran, perhaps not their doing)")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")

    table = actions.add_parser(
        "table", help="build the table of validated winners",
        description="Per problem the fastest candidate that passed; ATen unless a template "
        "beats it by more than --min-speedup. Written atomically.")
    table.add_argument("results", type=Path, nargs="+", metavar="RESULTS")
    table.add_argument("-o", "--output", type=Path, metavar="TABLE",
                       help="table file to write (required unless --check)")
    table.add_argument("--min-speedup", type=MIN_SPEEDUP.arg("--min-speedup"), default=1.0,
                       help="a template must be this many times faster than ATen (default 1.0)")
    table.add_argument("--check", action="store_true",
                       help="exit 1 if some problem has no validated winner")
    table.add_argument("--json", action="store_true", help="print the decisions as JSON")


def _collect(args: argparse.Namespace) -> int:
    from titan_rocm import adapters
    from titan_rocm.adapters.common import (
        CONFIG_FILE_FLAGS,
        CollectRequest,
        JobArgsError,
        flag_value,
    )
    from titan_rocm.files import OutputError, check_output
    from titan_rocm.tuner.collect import CollectError

    with as_command_error(adapters.NoAdapter, CollectError, OutputError, JobArgsError):
        adapter = adapters.installed()
        # Before the training step: a step's work is never lost to an unwritable -o.
        config = flag_value(args.passthrough, CONFIG_FILE_FLAGS)
        check_output(args.output, [config] if config else [])
        return adapter.tune_collect(CollectRequest(args.passthrough, args.output, args.trainer))


def _run(args: argparse.Namespace) -> int:
    from titan_rocm.files import OutputError, check_output
    from titan_rocm.testing.faults import FaultSpecError, disk_full_after, from_env
    from titan_rocm.tuned_gemms import problems
    from titan_rocm.tuned_gemms.records import load_state
    from titan_rocm.tuner import runner

    with as_command_error(problems.ProblemsError, runner.RunError, FaultSpecError, OutputError):
        from_env()
        disk_full_after()
        check_output(args.output, [args.problems])
        loaded = problems.read(args.problems)
        options = runner.Options(timeout=args.timeout, compile_timeout=args.compile_timeout,
                                 fudge=args.fudge, search_space=args.search_space,
                                 backends=args.backends, settings=loaded.settings)
        code = runner.run(loaded, args.output, args.gpus, options,
                          retry_quarantined=args.retry_quarantined)
    summary = runner.summary(load_state(args.output))
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"results: {summary['results']} over {summary['problems']} problems -> "
              f"{args.output}")
        if summary["quarantined"]:
            print(f"{summary['quarantined']} task(s) quarantined (started twice without a "
                  "result, recorded crash, never in a table); re-try them with: titan-rocm "
                  f"tune run {args.problems} -o {args.output} --retry-quarantined")
    return code


def _table_file_or_new(path: Path) -> None:
    """Refuse to replace an existing file that is not a GEMM table (it may be anything)."""
    from titan_rocm.files import read_regular
    from titan_rocm.tuned_gemms import table

    try:
        data = read_regular(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise table.LookupTableError(f"-o {path}: cannot read ({exc.strerror or exc})") from None
    if not data:
        return
    try:
        table.parse(data, path)
    except (table.LookupTableError, RecursionError):
        raise table.LookupTableError(
            f"-o {path} exists and is not a GEMM table written by `tune table`; refusing to "
            "replace it: remove it first or write to another file") from None


def _table(args: argparse.Namespace) -> int:
    import os

    from tabulate import tabulate

    from titan_rocm.files import OutputError, check_output
    from titan_rocm.tuned_gemms import table
    from titan_rocm.tuned_gemms.records import ResultsError, load_many

    if args.output is None and not args.check:
        raise CommandError("-o TABLE is required (unless --check)")
    with as_command_error(ResultsError, table.LookupTableError, OutputError):
        for path in args.results:
            try:
                os.stat(path)
            except FileNotFoundError:
                raise ResultsError(f"{path}: no such file") from None
        if args.output is not None:
            check_output(args.output, args.results)
            _table_file_or_new(args.output)
        built = table.build(load_many(args.results), args.min_speedup)
    if built.garbled:
        print(f"titan-rocm tune: skipped {built.garbled} garbled line(s) in the results",
              file=sys.stderr)
    if args.output is not None:
        try:
            table.write(built, args.output)
        except OSError as exc:
            raise CommandError(f"{args.output}: cannot write ({exc.strerror or exc})") from None
    if args.json:
        print(json.dumps({"meta": built.meta, "entries": len(built.table),
                          "problems": [d.to_dict() for d in built.decisions]}, indent=2))
    else:
        rows = [(d.op, d.winner["template_id"] if d.winner else "(none: ATen at run time)",
                 f"{d.done}/{d.tasks}", d.reason, d.key) for d in built.decisions]
        if rows:
            print(tabulate(rows, headers=("op", "winner", "tasks", "why", "problem"),
                           tablefmt="plain", disable_numparse=True))
        print(f"{len(built.decisions) - len(built.missing)}/{len(built.decisions)} problems "
              f"have a validated winner; {len(built.table)} keys"
              + (f" -> {args.output}" if args.output else ""))
    return 1 if args.check and built.missing else 0


def run(args: argparse.Namespace) -> int:
    """Run ``titan-rocm tune <action>``; return the exit code."""
    if args.action != "collect" and args.passthrough:
        raise CommandError(f"unrecognized arguments: {' '.join(args.passthrough)}")
    return {"collect": _collect, "run": _run, "table": _table}[args.action](args)
