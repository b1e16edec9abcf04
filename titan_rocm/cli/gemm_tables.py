"""``titan-rocm gemm-tables``: make aiter's tuned GEMM tables safe for HIP-graph capture
(docs/gemm-tables.md gives the exit codes). Torch-free."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from titan_rocm.cli import INTERRUPTED, CommandError
from titan_rocm.gemm_tables.capture_safe import (
    CaptureSafeError,
    CaptureSafeInterrupted,
    Result,
    capture_safe,
    totals,
)
from titan_rocm.gemm_tables.policy import POLICIES
from titan_rocm.platform import AITER_CHOICES, aiter_choices_help

HELP = (
    "Make aiter's tuned BF16 GEMM tables (AITER_CONFIG_GEMM_BF16) safe for HIP-graph "
    "capture: copy each table without the rows whose kernel hangs or aborts under capture "
    "with the aiter in use (split-K asm, opus and FlyDSL kernels; see --aiter)."
)

_CAPTURE_SAFE_HELP = (
    "Write each TABLE to OUTDIR under the same name without its capture-unsafe rows "
    "(every surviving byte unchanged) and print the AITER_CONFIG_GEMM_BF16 line to use. "
    "Exit 0 done, 1 --check found unsafe rows, 2 bad input or output (nothing written), "
    "130 interrupted (says which tables were written)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``gemm-tables`` actions (``capture-safe``) to ``parser``."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    safe = actions.add_parser(
        "capture-safe",
        help="copy tables without the rows unsafe under HIP-graph capture",
        description=_CAPTURE_SAFE_HELP,
    )
    safe.add_argument("tables", nargs="+", metavar="TABLE", help="aiter tuned BF16 GEMM CSV")
    safe.add_argument(
        "-o",
        "--output-dir",
        dest="outdir",
        metavar="OUTDIR",
        help="directory for the safe copies (created if missing; required unless --check)",
    )
    # --policy and --aiter are checked by capture_safe rather than by argparse choices, so a
    # bad value gets the same message (and, with --json, the same JSON) as any bad input.
    safe.add_argument(
        "--policy",
        default="splitk-opus",
        metavar="{" + ",".join(POLICIES) + "}",
        help="splitk-opus (default): remove split-K opus rows only; all-opus: remove every "
        "opus row of gfx942/gfx950 (the blunt fix, for comparison)",
    )
    safe.add_argument(
        "--arch",
        metavar="gfxNNN",
        help="architecture of rows without a gfx value (tables of older aiter); needed when "
        "their cu_num names no architecture or several",
    )
    safe.add_argument(
        "--aiter",
        metavar="{" + ",".join(AITER_CHOICES) + "}",
        help="the aiter that will read the tables, as titan-rocm plan --aiter names it "
        f"({aiter_choices_help()}: every rule applies); default: the aiter installed here, "
        "read from its sources (no aiter installed: every rule applies)",
    )
    safe.add_argument(
        "--check",
        action="store_true",
        help="write nothing; list the unsafe rows; exit 1 if there are any, 0 if none",
    )
    safe.add_argument("--json", action="store_true", help="print the report as JSON")


def _table(result: Result) -> list[str]:
    """The per-file, per-arch, per-libtype counts, aligned by tabulate (counts right-aligned)."""
    from tabulate import tabulate

    header = ("file", "arch", "libtype", "kept", "removed")
    rows: list[tuple[str, ...]] = []

    def add(name: str, counts: Counter[tuple[str, str, bool]]) -> None:
        for arch, libtype in sorted({(a, lt) for a, lt, _ in counts}):
            kept, removed = counts[(arch, libtype, False)], counts[(arch, libtype, True)]
            rows.append((name, arch, libtype, str(kept), str(removed)))

    for file_result in result.files:
        add(file_result.path.name, file_result.counts)
    if len(result.files) > 1:
        add("(all files)", totals(result))
    text = tabulate(rows, headers=header, tablefmt="plain", disable_numparse=True,
                    colalign=("left", "left", "left", "right", "right"))
    return [line.rstrip() for line in text.splitlines()]


def _print_text(result: Result) -> None:
    if result.check:
        for file_result in result.files:
            for n in file_result.removed.kept:
                print(
                    f"{file_result.path}:{n.line}: unsafe: {n.arch} cu_num={n.cu_num} "
                    f"{n.libtype} solidx={n.solidx} {n.kernel_name} ({n.rule}: {n.detail})"
                )
    print("\n".join(_table(result)))
    print(f"aiter: {result.aiter.known_as}")
    for rule in result.rule_counts():
        state = "holds" if rule["holds"] else "does not hold"
        counted = f"removes {rule['removed']} row(s)" if rule["holds"] else \
            f"keeps the {rule['kept_as_fixed']} row(s) it would remove"
        print(f"  rule {rule['name']}: {state}, {counted} ({rule['why']})")
    not_listed = sum(f.removed.not_listed for f in result.files)
    if result.check and not_listed:
        listed = sum(len(f.removed.kept) for f in result.files)
        print(f"... {not_listed} more unsafe row(s) not listed (the first {listed} are); "
              "all are counted")
    rows = sum(f.rows for f in result.files)
    verb = "would remove" if result.check else "removed"
    print(
        f"policy {result.policy}: {verb} {result.unsafe_rows} of {rows} rows "
        f"in {len(result.files)} table(s)"
    )
    env = result.env_line()
    if env is not None:
        print(env)


def _print_warnings(result: Result) -> None:
    for file_result in result.files:
        for n in file_result.disagreements.kept:
            print(
                f"warning: {file_result.path}:{n.line}: kernelName and solidx disagree "
                f"({n.detail}): {n.kernel_name}",
                file=sys.stderr,
            )
    unknown: Counter[tuple[str, str]] = Counter()
    for file_result in result.files:
        unknown.update(file_result.unknown_cu_nums)
    for (arch, cu_num), count in sorted(unknown.items()):
        print(
            f"note: {count} {arch} row(s) carry cu_num {cu_num}, which titan_rocm.archs does "
            f"not list for {arch}",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    """Run ``titan-rocm gemm-tables <action>``; return the exit code."""
    try:
        result = capture_safe(
            args.tables,
            args.outdir,
            policy=args.policy,
            arch=args.arch,
            check=args.check,
            aiter=args.aiter,
        )
    except CaptureSafeError as exc:
        raise CommandError(str(exc)) from None
    except CaptureSafeInterrupted as exc:
        raise CommandError(f"interrupted; {exc}", INTERRUPTED) from None
    code = 1 if args.check and result.unsafe_rows else 0
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print_text(result)
    _print_warnings(result)
    return code
