"""``titan-rocm tune``: validated GEMM tuning for a TorchTitan job (docs/validated-tuning.md).

- ``collect``: one step of the job, recording every GEMM problem (``-o problems.jsonl``).
- ``run``: every candidate of every problem checked against a float64 reference in a
  crash-isolated minesweeper, timed if it passed (``-o results.jsonl``, resumed).
- ``table``: the fastest validated candidate per problem (``-o gemm_lookup.json``).

Exit codes: 0 done (``table --check``: every problem has a validated winner), 1 a device
could not be used (``run``) or some problem has no winner (``table --check``), 2 bad input
(nothing overwritten).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from titan_rocm.cli import CommandError

HELP = "validated GEMM tuning: collect a job's GEMMs, check and time every kernel, build a table"
PASSTHROUGH = True  # collect hands TorchTitan's flags on


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tune`` actions to ``parser``."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    collect = actions.add_parser(
        "collect", help="record every GEMM problem of one step of the job",
        description="Run one step of the job (TorchTitan's flags, e.g. --job.config_file X) "
        "with every GEMM compiled by ATen, and record the problems Inductor lowers.")
    collect.add_argument("-o", "--output", type=Path, required=True, metavar="PROBLEMS",
                         help="problems file to write (JSON lines)")
    collect.add_argument("--trainer", default="torchtitan.train:Trainer", metavar="MODULE:CLASS",
                         help="the trainer class (default TorchTitan's; for forks of it)")

    run = actions.add_parser(
        "run", help="check and time every candidate of every problem (resumable)",
        description="Check every candidate kernel of every problem against a float64 "
        "reference in a crash-isolated process, time the ones that pass; append to RESULTS "
        "and resume it when it exists.")
    run.add_argument("problems", type=Path, metavar="PROBLEMS")
    run.add_argument("-o", "--output", type=Path, required=True, metavar="RESULTS")
    run.add_argument("--gpus", default="all", help="all (default) or indices such as 0,1")
    run.add_argument("--timeout", type=float, default=30.0, metavar="S",
                     help="seconds a candidate may take to run once, and to be timed "
                     "(default 30)")
    run.add_argument("--compile-timeout", type=float, default=900.0, metavar="S",
                     help="seconds to compile a problem's candidates or load one (default 900)")
    run.add_argument("--search-space", choices=("default", "exhaustive"), default="default",
                     help="Inductor's GEMM search space (max_autotune_gemm_search_space)")
    run.add_argument("--fudge", type=float, default=3.0,
                     help="tolerance = FUDGE x max(ATen's own error, dtype default) (default 3)")
    run.add_argument("--backends", default="ATEN,TRITON",
                     help="Inductor GEMM backends to enumerate (default ATEN,TRITON; a table "
                     "only holds those; ATEN,CPP lets the CPU tests see two candidates)")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")

    table = actions.add_parser(
        "table", help="build the table of validated winners",
        description="Per problem the fastest candidate that passed; ATen unless a template "
        "beats it by more than --min-speedup. Written atomically.")
    table.add_argument("results", type=Path, nargs="+", metavar="RESULTS")
    table.add_argument("-o", "--output", type=Path, metavar="TABLE",
                       help="table file to write (required unless --check)")
    table.add_argument("--min-speedup", type=float, default=1.0,
                       help="a template must be this many times faster than ATen (default 1.0)")
    table.add_argument("--check", action="store_true",
                       help="exit 1 if some problem has no validated winner")
    table.add_argument("--json", action="store_true", help="print the decisions as JSON")


def _error(message: str) -> int:
    """Refuse with ``message`` (exit 2; the JSON error envelope under ``--json``)."""
    raise CommandError(message)


def _collect(args: argparse.Namespace) -> int:
    from titan_rocm.tuning.collect import CollectError, collect

    try:
        return collect(args.passthrough, args.output, args.trainer)
    except CollectError as exc:
        return _error(str(exc))


def _run(args: argparse.Namespace) -> int:
    from titan_rocm.tuning import problems, runner
    from titan_rocm.tuning.faults import FaultSpecError, from_env
    from titan_rocm.tuning.records import load_state

    for name in ("timeout", "compile_timeout", "fudge"):
        if getattr(args, name) <= 0:
            return _error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    try:
        from_env()
        loaded = problems.read(args.problems)
        options = runner.Options(timeout=args.timeout, compile_timeout=args.compile_timeout,
                                 fudge=args.fudge, search_space=args.search_space,
                                 backends=args.backends.upper(), settings=loaded.settings)
        code = runner.run(loaded, args.output, args.gpus, options)
    except (problems.ProblemsError, runner.RunError, FaultSpecError) as exc:
        return _error(str(exc))
    summary = runner.summary(load_state(args.output))
    print(json.dumps(summary) if args.json else
          f"results: {summary['results']} over {summary['problems']} problems -> {args.output}")
    return code


def _table(args: argparse.Namespace) -> int:
    from titan_rocm.tuning import table
    from titan_rocm.tuning.records import ResultsError, load_many

    if args.output is None and not args.check:
        return _error("-o TABLE is required (unless --check)")
    if args.min_speedup <= 0:
        return _error(f"--min-speedup {args.min_speedup}: must be > 0")
    try:
        for path in args.results:
            if not path.is_file():
                raise ResultsError(f"{path}: no such file")
        built = table.build(load_many(args.results), args.min_speedup)
    except (ResultsError, table.LookupTableError) as exc:
        return _error(str(exc))
    if built.garbled:
        print(f"titan-rocm tune: skipped {built.garbled} garbled line(s) in the results",
              file=sys.stderr)
    if args.output is not None:
        try:
            table.write(built, args.output)
        except OSError as exc:
            return _error(f"{args.output}: cannot write ({exc.strerror or exc})")
    if args.json:
        print(json.dumps({"meta": built.meta, "entries": len(built.table),
                          "problems": [d.to_dict() for d in built.decisions]}, indent=2))
    else:
        for d in built.decisions:
            what = d.winner["template_id"] if d.winner else "(none: ATen at run time)"
            print(f"{d.op:<10} {what:<24} {d.done}/{d.tasks} tasks  {d.reason}  {d.key}")
        print(f"{len(built.decisions) - len(built.missing)}/{len(built.decisions)} problems "
              f"have a validated winner; {len(built.table)} keys"
              + (f" -> {args.output}" if args.output else ""))
    return 1 if args.check and built.missing else 0


def run(args: argparse.Namespace) -> int:
    """Run ``titan-rocm tune <action>``; return the exit code."""
    if args.action != "collect" and args.passthrough:
        return _error(f"unrecognized arguments: {' '.join(args.passthrough)}")
    return {"collect": _collect, "run": _run, "table": _table}[args.action](args)
