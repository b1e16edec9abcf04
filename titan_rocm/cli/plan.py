"""``titan-rocm plan``: check a TorchTitan job on a login node before it waits in a queue
(docs/plan.md)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from titan_rocm.cli import CommandError, as_command_error
from titan_rocm.numbers import RANKS
from titan_rocm.platform import AITER_CHOICES, aiter_choices_help

if TYPE_CHECKING:
    from titan_rocm.adapters import Adapter

HELP = (
    "The options below are plan's own; `titan-rocm plan --help-torchtitan` lists TorchTitan's "
    "flags and [rocm]'s (0.3.0: with the job's --module M --config F). "
    "Check a TorchTitan job the way TorchTitan starts it and, if it would start, build its "
    "model on the meta device, apply titan-rocm's converters and print what a run would do: "
    "which workarounds apply or skip and why, how each block compiles, which grouped-MM "
    "backend MoE layers call, and the settings in force. TorchTitan 0.2.2: --job.config_file "
    "X.toml, with every start-up check 0.2.2 makes that needs no GPU (config, imports, "
    "converter names, parallel degrees against the world size); TorchTitan 0.3.0: --module M "
    "--config F (the installed TorchTitan decides). Exit 0 planned, 2 bad input or a job that "
    "would fail at start-up."
)

EPILOG = (
    "Every other option is TorchTitan's and is passed on as on the training command line "
    "(--model.converters rocm, --parallelism.tensor_parallel_degree 2, --compile.enable, "
    "--rocm.triton_war off, ...); `titan-rocm plan --help-torchtitan` lists them all, "
    "[rocm]'s included. Boolean flags are bare: --rocm.triton_war_strict (true), "
    "--rocm.no-triton_war_strict (false)."
)

PASSTHROUGH = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``titan-rocm plan``; unknown options are TorchTitan's."""
    from titan_rocm.adapters.common import DEFAULT_LAUNCHER, LAUNCHERS

    parser.epilog = EPILOG
    parser.allow_abbrev = False  # a TorchTitan flag must never be taken for a prefix of ours
    parser.add_argument(
        "--job.config_file", "--job.config-file", dest="config_file", metavar="FILE",
        help="the job's TOML file (TorchTitan's flag, passed on to it)",
    )
    parser.add_argument(
        "--arch",
        help="simulate a ROCm machine with this GPU target (gfx942, gfx950, gfx90a, ...)",
    )
    parser.add_argument(
        "--aiter",
        choices=AITER_CHOICES,
        help=f"with --arch: the aiter the simulated machine has ({aiter_choices_help()}; "
        "default 0.1.7)",
    )
    parser.add_argument(
        "--primus-turbo",
        choices=("present", "absent"),
        help="with --arch: whether the simulated machine has Primus-Turbo (default: as this "
        "machine); decides what grouped_mm_backend = auto picks",
    )
    parser.add_argument(
        "--launcher", choices=LAUNCHERS, default=DEFAULT_LAUNCHER,
        help="how the job starts: torchtitan = `torchrun -m torchtitan.train` (default: the "
        "TOML must carry custom_import / custom_config_module itself), titan-rocm = "
        "`torchrun -m titan_rocm.train` or titan-rocm-train (adds both)",
    )
    parser.add_argument(
        "--world-size", type=RANKS.arg("--world-size"), metavar="N",
        help="number of ranks of the run (default: the smallest the degrees fit, said so)",
    )
    parser.add_argument(
        "--nnodes", type=RANKS.arg("--nnodes"), metavar="N",
        help="as on the job's torchrun line: nodes (world size = nnodes x nproc-per-node)",
    )
    parser.add_argument(
        "--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
        type=RANKS.arg("--nproc-per-node"), metavar="N",
        help="as on the job's torchrun line: processes (GPUs) per node",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--verbose", action="store_true",
        help="also show how each workaround reaches into the job (patched functions, cache "
        "keys, guard coverage) and every [rocm] setting, defaults included",
    )
    parser.add_argument(
        "--tune-problems", metavar="PROBLEMS",
        help="a problems file from `titan-rocm tune collect`: show how many of the job's GEMMs "
        "[rocm] gemm_lookup_table covers",
    )
    parser.add_argument(
        "--help-torchtitan", action="store_true",
        help="list every TorchTitan and --rocm.* flag (TorchTitan's own help) and exit",
    )


USAGE = (
    "name the job to plan: --job.config_file X.toml [TorchTitan flags] (TorchTitan 0.2.2), "
    "or --module M --config F (TorchTitan 0.3.0); titan-rocm plan --help lists plan's own "
    "options, titan-rocm plan --help-torchtitan TorchTitan's"
)


def _refuse_early(args: argparse.Namespace, passthrough: list[str], adapter: Adapter) -> None:
    """Every refusal that needs no torch, made before torch and TorchTitan load (10-20 s on a login
    node)."""
    from titan_rocm.adapters.common import JobArgsError, StartupError, check_world_flags
    from titan_rocm.archs import arch_facts

    with as_command_error(StartupError):
        check_world_flags(args.world_size, args.nnodes, args.nproc_per_node)
    with as_command_error(ValueError):
        if args.arch is not None:
            arch_facts(args.arch)
        elif args.aiter is not None or args.primus_turbo is not None:
            from titan_rocm.platform import planned_facts

            planned_facts(None, args.aiter, args.primus_turbo)  # refuses before reading torch
    with as_command_error(JobArgsError):
        adapter.check_job_args(passthrough)
    if args.tune_problems and not os.path.isfile(args.tune_problems):
        raise CommandError(f"--tune-problems {args.tune_problems!r}: no such file")


def _installed() -> Adapter:
    from titan_rocm import adapters

    with as_command_error(adapters.NoAdapter):
        return adapters.installed()


def run(args: argparse.Namespace) -> int:
    """Print the plan; 0 on success, 2 on a bad job, flag, architecture or start-up failure."""
    from titan_rocm.adapters.common import JobArgsError, PlanRequest, StartupError

    adapter = _installed()
    passthrough = list(args.passthrough)
    if args.help_torchtitan:
        with as_command_error(StartupError):
            return adapter.torchtitan_help(passthrough)
    with as_command_error(JobArgsError):
        adapter.refuse_other_flags(passthrough)
    if args.config_file is not None:
        passthrough = ["--job.config_file", args.config_file, *passthrough]
    if not passthrough:
        # Without a job, TorchTitan would plan its own default llama3 job: never what is meant.
        print("usage: titan-rocm plan --job.config_file X.toml | --module M --config F "
              "[options] [TorchTitan flags]", file=sys.stderr)
        raise CommandError(USAGE)
    _refuse_early(args, passthrough, adapter)
    warned: list[str] = []
    try:
        with torchtitan_warnings(warned):
            with as_command_error(StartupError):
                plan = adapter.plan(PlanRequest(
                    passthrough, arch=args.arch, world_size=args.world_size,
                    nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
                    launcher=args.launcher, aiter=args.aiter, primus_turbo=args.primus_turbo))
        if args.tune_problems:
            error = _add_coverage(plan, args.tune_problems, passthrough)
            if error:
                raise CommandError(error)
        from titan_rocm.plan_format import format_plan

        print(json.dumps(plan, indent=2, default=str) if args.json
              else format_plan(plan, verbose=args.verbose))
        sys.stdout.flush()  # the answer first, then whose the warnings are
    finally:
        for message in warned:
            print(WARNED + message, file=sys.stderr)
    return 0


class _TorchTitanWarnings(logging.Handler):
    """Keeps the warnings TorchTitan's own code logs (each once); hands every other record on."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if f"{os.sep}torchtitan{os.sep}" in record.pathname:
            if (message := record.getMessage()) not in self.messages:
                self.messages.append(message)
        elif not self._others_handle(record):
            logging.lastResort.handle(record)  # type: ignore[union-attr]

    def _others_handle(self, record: logging.LogRecord) -> bool:
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return True
            logger = logger.parent if logger.propagate else None
        return False


WARNED = ("TorchTitan warned while titan-rocm plan read the job (its own warning, which the "
          "job prints at start-up too; the plan goes on regardless): ")
"""Put before each of TorchTitan's warnings, so it is not read as plan's own answer."""


@contextlib.contextmanager
def torchtitan_warnings(messages: list[str]) -> Iterator[None]:
    """Collect TorchTitan's warnings while it reads the job, so they do not print bare before the
    plan's answer."""
    root = logging.getLogger()
    handler = _TorchTitanWarnings()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        messages += handler.messages


SHAPE_FLAGS = ("--model.", "--training.", "--parallelism.", "--compile.")
"""TorchTitan flags that decide which GEMMs a job lowers; a problems file may differ elsewhere."""


def _shape_flags(args: list[str]) -> list[str]:
    """``args``' shape-deciding flags with their values (``--a b`` and ``--a=b`` alike)."""
    out: list[str] = []
    keep = False
    for arg in args:
        if arg.startswith("--"):
            key, sep, value = arg.partition("=")
            keep = key.startswith(SHAPE_FLAGS)
            if keep:
                out += [key, value] if sep else [key]
        elif keep:
            out.append(arg)
    return out


def _job_differences(plan: dict, job: dict, passthrough: list[str]) -> list[str]:
    """How the problems file's job differs from the job planned, in what decides its GEMMs."""
    differs = []
    planned_file, collected_file = plan.get("config_file"), job.get("config_file")
    # 0.3.0 names its job --module M --config F (no file): the same words are the same job.
    if planned_file and collected_file and planned_file != collected_file and not (
            os.path.exists(planned_file) and os.path.exists(collected_file)
            and os.path.samefile(planned_file, collected_file)):
        differs.append(f"collected from {collected_file}, this job is {planned_file}")
    world = (plan.get("world_size") or {}).get("size")
    if job.get("world_size") not in (None, world):
        differs.append(f"collected on {job['world_size']} rank(s), this plan has {world}")
    if "args" in job:
        collected, planned = _shape_flags(list(job["args"])), _shape_flags(passthrough)
        if collected != planned:
            differs.append(f"collected with the flags [{' '.join(collected)}], this job has "
                           f"[{' '.join(planned)}] (model, training, parallelism, compile)")
    return differs


def _add_coverage(plan: dict, problems: str, passthrough: list[str]) -> str | None:
    """Put the table's coverage of ``problems`` into gemm_lookup's details and say how the problems'
    job differs; an error or None."""
    from titan_rocm.tuned_gemms.problems import ProblemsError
    from titan_rocm.tuned_gemms.table import LookupTableError, problems_coverage

    decision = next((d for d in plan["workarounds"] if d["workaround"] == "gemm_lookup"), None)
    table = plan["settings"].get("gemm_lookup_table")
    if decision is None or not table:
        return "--tune-problems needs a table: set [rocm] gemm_lookup_table"
    try:
        found = problems_coverage(table, problems, plan["model"]["name"], plan["model"]["flavor"])
    except (LookupTableError, ProblemsError) as exc:
        return str(exc)
    found["job_differs"] = _job_differences(plan, found.pop("job"), passthrough)
    for line in found["job_differs"]:
        print(f"titan-rocm plan: warning: {problems} is not this job's: {line}", file=sys.stderr)
    decision["details"]["coverage"] = found
    return None
