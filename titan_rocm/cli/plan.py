"""``titan-rocm plan``: check a TorchTitan job on a login node before it waits in a queue."""

from __future__ import annotations

import argparse
import json
import sys

from titan_rocm.platform import AITER_CHOICES

HELP = (
    "Read a TorchTitan job exactly as TorchTitan would, build its model on the meta device, "
    "apply titan-rocm's converters and print what a run would do: which workarounds apply "
    "or skip and why, how each block compiles, which grouped-MM backend MoE layers call, "
    "and the settings in force. Any TorchTitan or --rocm.* flag may follow. TorchTitan 0.2.2: "
    "--job.config_file X.toml; TorchTitan 0.3.0: --module M --config F (the installed "
    "TorchTitan decides)."
)


PASSTHROUGH = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``titan-rocm plan``; unknown options are TorchTitan's."""
    parser.add_argument(
        "--arch",
        help="simulate a ROCm machine with this GPU target (gfx942, gfx950, gfx90a, ...)",
    )
    parser.add_argument(
        "--aiter",
        choices=AITER_CHOICES,
        help="with --arch: the aiter the simulated machine has (default 0.1.7, the PyPI wheel)",
    )
    parser.add_argument(
        "--world-size", type=int, help="number of ranks (default: product of explicit degrees)"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--tune-problems", metavar="PROBLEMS",
        help="a problems file from `titan-rocm tune collect`: show how many of the job's GEMMs "
        "[rocm] gemm_lookup_table covers",
    )


def run(args: argparse.Namespace) -> int:
    """Print the plan; 0 on success, 2 on a bad job, flag or architecture."""
    from titan_rocm import torchtitan_version
    from titan_rocm.plan import PlanError, format_plan, make_plan

    errors: tuple[type[Exception], ...] = (PlanError,)
    if torchtitan_version.series() == "0.3":
        from titan_rocm.torchtitan.plan import PlanError as PlanError030
        from titan_rocm.torchtitan.plan import make_plan as make_plan_030

        make_plan, errors = make_plan_030, (PlanError030,)
    try:
        plan = make_plan(args.passthrough, arch=args.arch, world_size=args.world_size,
                         aiter=args.aiter)
    except errors as exc:
        print(f"titan-rocm plan: {exc}", file=sys.stderr)
        return 2
    if args.tune_problems:
        error = _add_coverage(plan, args.tune_problems)
        if error:
            print(f"titan-rocm plan: {error}", file=sys.stderr)
            return 2
    print(json.dumps(plan, indent=2, default=str) if args.json else format_plan(plan))
    return 0


def _add_coverage(plan: dict, problems: str) -> str | None:
    """Put the table's coverage of ``problems`` into gemm_lookup's details; an error or None."""
    from titan_rocm.tuning.problems import ProblemsError
    from titan_rocm.tuning.table import TableError, problems_coverage

    decision = next((d for d in plan["workarounds"] if d["workaround"] == "gemm_lookup"), None)
    table = (decision or {}).get("details", {}).get("table")
    if not table:
        return "--tune-problems needs a table: set [rocm] gemm_lookup_table"
    try:
        decision["details"]["coverage"] = problems_coverage(  # type: ignore[index]
            table, problems, plan["model"]["name"], plan["model"]["flavor"])
    except (TableError, ProblemsError) as exc:
        return str(exc)
    return None
