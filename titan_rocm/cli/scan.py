"""``titan-rocm scan``: audit AMDGCN files (Triton/Inductor caches) for the buffer-store data hazard
(docs/triton-buffer-store-hazard.md gives the exit codes).

AMDGCN is recognised positively: anything else found is named as not scanned, never counted as a
clean scan."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from titan_rocm.files import TooLargeError, read_regular
from titan_rocm.progress import Progress
from titan_rocm.scanner.hazards import CLI_RULES
from titan_rocm.scanner.scan import (
    ScanReport,
    Search,
    find_amdgcn_files,
    not_amdgcn,
    note_cut_kernels,
    scan_text,
)
from titan_rocm.settings import DEFAULT_HAZARD_RULE

MAX_FILE_BYTES = 64 << 20
"""The largest AMDGCN file scanned (read whole, about 3 times its size in memory); a bigger one is
named as not scanned."""

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
    parser.add_argument(
        "--json", action="store_true",
        help="print one JSON object: exit_code, hazards (a list), files_scanned, not_scanned, "
        "messages (what stderr said)")


_errors: list[str] = []
"""What this run said on stderr, for ``--json``'s ``messages`` (reset by :func:`run`)."""


def _err(msg: str) -> None:
    _errors.append(msg)
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
        with Progress(len(files), "file", "titan-rocm scan") as progress:
            for f in files:
                progress.update()
                reason = _scan_one(f, args, reports)
                if reason == "bad":
                    bad_input = True
                elif reason == "not_scanned":
                    not_scanned += 1
                    bad_input = bad_input or given  # named on the command line, not AMDGCN
    for line in search.skipped + search.notes:
        _err(line)
    return reports, not_scanned + len(search.skipped), bad_input


def _scan_one(f: Any, args: argparse.Namespace, reports: list[ScanReport]) -> str | None:
    """Scan one file into ``reports``: None, or ``bad`` (unreadable) / ``not_scanned``."""
    try:
        data = read_regular(f, MAX_FILE_BYTES)
    except TooLargeError as exc:
        _err(f"{f}: not scanned: {exc.size} bytes, more than the {MAX_FILE_BYTES >> 20} "
             "MiB scan reads (a kernel's AMDGCN is a few MiB)")
        return "not_scanned"
    except OSError as exc:
        _err(f"cannot read {str(f)!r}: {exc.strerror or exc}")
        return "bad"
    reason = not_amdgcn(data)
    if reason is not None:
        _err(f"{f}: not scanned: not AMDGCN ({reason})")
        return "not_scanned"
    reports.append(note_cut_kernels(
        scan_text(data, arch=args.arch, rule=args.rule, file=str(f)), data))
    return None


def run(args: argparse.Namespace) -> int:
    """Scan every PATH; print hazards; return the exit code."""
    _errors.clear()
    reports, not_scanned, bad_input = _scan_paths(args)
    with_code = [r for r in reports if r.has_code]
    for r in reports:
        if not r.has_code:
            _err(f"{r.file}: not scanned: no AMDGCN instructions")
    hazards = [h for r in with_code for h in r.hazards]
    # Wide global/flat stores whose data the VALU overwrites too soon: a compiler bug that
    # recompiling with buffer ops off cannot fix, but a hazard all the same.
    unprotected = [i for r in with_code for i in r.info if i.unprotected]

    if not args.json:
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
        code = 2
    elif hazards or unprotected:
        code = 1
    else:
        code = 2 if bad_input else 0
    if args.json:
        # One object, so an error (exit 2, nothing scanned) never reads as a clean empty list.
        print(json.dumps({
            "exit_code": code,
            "hazards": [h.to_dict() for h in hazards] + [i.to_dict() for i in unprotected],
            "files_scanned": len(with_code),
            "not_scanned": not_scanned + len(reports) - len(with_code),
            "messages": list(_errors),
        }, indent=2))
    return code


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
    cut = sum(1 for r in reports if r.cut_kernels)
    if cut:
        line += f"; {cut} file(s) end before their kernel does (truncated, named on stderr)"
    if not_scanned:
        line += f"; {not_scanned} not scanned (named on stderr)"
    print(line)
