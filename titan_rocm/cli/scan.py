"""``titan-rocm scan``: audit AMDGCN files (Triton/Inductor caches) for the buffer-store
data hazard.

Exit status: 0 no hazard, 1 hazards found, 2 bad input (a path that does not exist or
cannot be read, a path given that is not AMDGCN, or no AMDGCN found at all), 130
interrupted. AMDGCN is recognised positively (``not_amdgcn``): anything else found in a
directory (binary junk, a README, an empty or truncated-to-nothing file) is named on stderr
as not scanned and skipped, and never counts as a clean scan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from titan_rocm.files import read_regular
from titan_rocm.settings import DEFAULT_HAZARD_RULE
from titan_rocm.workarounds.triton_war.hazards import CLI_RULES
from titan_rocm.workarounds.triton_war.scan import (
    ScanReport,
    Search,
    find_amdgcn_files,
    not_amdgcn,
    scan_text,
)

HELP = (
    "audit AMDGCN files (Triton caches keep <kernel>.amdgcn) for wide stores whose data "
    "registers a VALU instruction overwrites too soon; exit 0 clean, 1 hazards, 2 bad input"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``titan-rocm scan``."""
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="an .amdgcn file, or a directory searched recursively for *.amdgcn "
        "(directory symlinks followed, each directory and file once)",
    )
    parser.add_argument(
        "--arch",
        default=None,
        help="architecture to scan for (gfx942, gfx950...); default: each file's .amdgcn_target",
    )
    parser.add_argument(
        "--rule",
        choices=CLI_RULES,
        default=DEFAULT_HAZARD_RULE,
        help="precise: 1 wait state after a store with an SGPR soffset, 2 with a literal "
        "(the hardware rule); conservative: 2 for every soffset",
    )
    parser.add_argument("--json", action="store_true", help="print hazards as a JSON list")


def _err(msg: str) -> None:
    print(f"titan-rocm scan: {msg}", file=sys.stderr)


def _scan_paths(args: argparse.Namespace) -> tuple[list[ScanReport], int, bool]:
    """Reports of the AMDGCN files found, files not scanned, and whether input was bad."""
    reports: list[ScanReport] = []
    search = Search()
    bad_input = False
    not_scanned = 0
    for path in args.paths:
        reported_before = len(search.skipped) + len(search.notes)
        try:
            files = list(find_amdgcn_files(path, search))
        except FileNotFoundError as exc:
            _err(str(exc))
            bad_input = True
            continue
        except OSError as exc:
            _err(f"cannot read {path!r}: {exc.strerror or exc}")
            bad_input = True
            continue
        given = not os.path.isdir(path)  # a file named on the command line
        if not files and not given and len(search.skipped) + len(search.notes) == reported_before:
            _err(f"no .amdgcn files under {path!r}")
            bad_input = True
        for f in files:
            try:
                data = read_regular(f)
            except OSError as exc:
                _err(f"cannot read {str(f)!r}: {exc.strerror or exc}")
                bad_input = True
                continue
            reason = not_amdgcn(data)
            if reason is not None:
                _err(f"{f}: not scanned: not AMDGCN ({reason})")
                not_scanned += 1
                bad_input = bad_input or given  # named on the command line, yet not AMDGCN
                continue
            reports.append(scan_text(data, arch=args.arch, rule=args.rule, file=str(f)))
    for line in search.skipped + search.notes:
        _err(line)
    return reports, not_scanned + len(search.skipped), bad_input


def run(args: argparse.Namespace) -> int:
    """Scan every PATH; print hazards; return the exit code."""
    reports, not_scanned, bad_input = _scan_paths(args)
    with_code = [r for r in reports if r.has_code]
    for r in reports:
        if not r.has_code:
            _err(f"{r.file}: not scanned: no AMDGCN instructions")
    hazards = [h for r in with_code for h in r.hazards]
    # Wide global/flat stores whose data the VALU overwrites too soon: a compiler bug that
    # recompiling with buffer ops off cannot fix, but a hazard all the same.
    unprotected = [i for r in with_code for i in r.info if i.unprotected]

    if args.json:
        print(json.dumps([h.to_dict() for h in hazards]
                         + [i.to_dict() for i in unprotected], indent=2))
    else:
        for h in hazards:
            print(
                f"{h.file}:{h.line}: {h.kernel or '?'}: `{h.store}` data overwritten by "
                f"`{h.writer}` (line {h.writer_line}) after {h.wait_states} wait state(s), "
                f"needs {h.required}; path {h.path}"
            )
        for i in unprotected:
            print(
                f"{i.file}:{i.line}: {i.kernel or '?'}: `{i.store}` data overwritten by "
                f"`{i.writer}` (line {i.writer_line}) after {i.wait_states} wait state(s), "
                f"needs {i.required}; a {i.kind} store: recompiling with buffer ops off "
                "cannot fix it (a compiler bug)"
            )
        if with_code:
            _summary(with_code, hazards, unprotected, args.rule,
                     not_scanned + len(reports) - len(with_code))
    for note in sorted({n for r in with_code for n in r.notes}):
        _err(f"note: {note}")

    if not with_code:
        _err("no AMDGCN found in the given paths")
        return 2
    if hazards or unprotected:
        return 1
    return 2 if bad_input else 0


def _summary(reports: list[ScanReport], hazards: list, unprotected: list, rule: str,
             not_scanned: int) -> None:
    stores = sum(r.stores_checked for r in reports)
    kernels = {(h.file, h.kernel) for h in hazards}
    info = sum(len(r.info) for r in reports)
    line = (
        f"scanned {len(reports)} file(s), {stores} buffer store(s) wider than 64 bits, "
        f"rule {rule}: {len(hazards)} hazardous store(s) in {len(kernels)} kernel(s)"
    )
    if info:
        line += f"; {info} global/flat store(s) wider than 64 bits"
        if unprotected:
            line += f", {len(unprotected)} of them overwritten too soon (not fixable here)"
    if not_scanned:
        line += f"; {not_scanned} not scanned (named on stderr)"
    print(line)
