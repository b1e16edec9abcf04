"""Scan AMDGCN text or files for the buffer-store data hazard; imports neither torch nor triton so
``titan-rocm scan`` stays light."""

from __future__ import annotations

import bisect
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from titan_rocm.archs import ARCHS, normalize_arch
from titan_rocm.files import describe_mode, read_regular
from titan_rocm.scanner.amdgcn import Program, TextView, parse
from titan_rocm.scanner.hazards import (
    Finding,
    Rule,
    RuleResult,
    StoreDataRule,
    StoreSite,
    get_rule,
)
from titan_rocm.serial import json_form
from titan_rocm.settings import DEFAULT_HAZARD_RULE

__all__ = [
    "Hazard",
    "StoreInfo",
    "ScanReport",
    "scan_text",
    "scan_program",
    "scan_path",
    "find_amdgcn_files",
    "not_amdgcn",
    "Search",
]

# Arch verdicts in ScanReport.arch_status.
AFFECTED = "affected"
UNKNOWN = "unknown"

STORE_KEYS = ("file line kernel kind recompile_fixes store writer writer_line wait_states "
              "required path")
"""The keys of one store in ``titan-rocm scan --json``, a hazard's and a checked store's."""


@dataclass(frozen=True)
class Hazard:
    """One hazardous store: a VALU instruction overwrites its data registers too soon."""

    kernel: str | None
    """The function label containing the store (the Triton kernel name)."""
    line: int
    store: str
    writer: str
    writer_line: int
    wait_states: int
    """Wait states between store and writer on the worst path."""
    required: int
    """Wait states the rule requires (-1: the naive rule, unbounded)."""
    path: tuple[int, ...] | str
    """``"straight line"``, or the branches taken on the way (``"s_cbranch_scc1 to .LBB0_1"``)."""
    file: str | None = None

    def to_dict(self) -> dict[str, object]:
        """One hazard of ``titan-rocm scan --json``."""
        return json_form(self, STORE_KEYS, kind="buffer", recompile_fixes=True,
                         path=self.path if isinstance(self.path, str) else list(self.path))


@dataclass(frozen=True)
class StoreInfo:
    """A wide global/flat/scratch store: informational, since recompiling without buffer ops cannot
    remove it (llvm-project #202333)."""

    kernel: str | None
    line: int
    store: str
    kind: str
    file: str | None = None
    writer: str | None = None
    writer_line: int | None = None
    wait_states: int | None = None
    required: int | None = None

    @property
    def unprotected(self) -> bool:
        """A VALU instruction overwrites the data within the window."""
        return self.writer is not None

    def to_dict(self) -> dict[str, object]:
        """JSON-able form (``titan-rocm scan --json`` lists unprotected ones)."""
        return json_form(self, STORE_KEYS, recompile_fixes=False, path=None)


@dataclass
class ScanReport:
    """The result of scanning one AMDGCN text with one rule."""

    arch: str | None
    rule: str
    hazards: list[Hazard]
    stores_checked: int
    info: list[StoreInfo] = field(default_factory=list)
    file: str | None = None
    kernels: list[str] = field(default_factory=list)
    has_code: bool = False
    """False for empty, junk or non-assembly input."""
    arch_status: str = UNKNOWN
    """``affected`` or ``unknown`` (scanned as if affected: no arch is exempt)."""
    notes: list[str] = field(default_factory=list)
    cut_kernels: list[str] = field(default_factory=list)
    """Kernels declared but never ended (no ``.size``): the file was cut, the rest unscanned."""

    @property
    def hazardous(self) -> bool:
        """True when at least one hazardous store was found."""
        return bool(self.hazards)


def _arch_status(arch: str | None) -> tuple[str, str | None]:
    if arch is None:
        return UNKNOWN, "no .amdgcn_target and no --arch: scanned as if the hazard applies"
    facts = ARCHS.get(arch)
    if facts is None:
        known = ", ".join(sorted(ARCHS))
        return UNKNOWN, (
            f"architecture {arch!r} is unknown to titan-rocm (known: {known}): "
            "scanned as if the hazard applies"
        )
    if not facts.store_hazard_windows:
        return UNKNOWN, (
            f"titan-rocm has no hazard-window facts for {arch}: scanned as if the hazard "
            "applies"
        )
    return AFFECTED, None


def _path_text(program: Program, path: tuple[int, ...]) -> str:
    steps = []
    for a, b in zip(path, path[1:], strict=False):
        instrs = program.blocks[a].instructions
        last = instrs[-1] if instrs else None
        if last is None or last.branch_target is None and not last.mnemonic.startswith("s_cb"):
            continue  # plain fallthrough
        if program.labels.get(last.branch_target or "") == b:
            steps.append(f"{last.mnemonic} to {last.branch_target}")
        else:
            steps.append(f"{last.mnemonic} not taken")
    return ", ".join(steps) if steps else "straight line"


def scan_program(
    program: Program,
    *,
    arch: str | None = None,
    rule: str | Rule = DEFAULT_HAZARD_RULE,
    file: str | None = None,
) -> ScanReport:
    """Scan an already parsed program (see :func:`scan_text`)."""
    the_rule = get_rule(rule)
    arch_name = normalize_arch(arch) if arch else program.arch
    status, note = _arch_status(arch_name)
    result = the_rule.check(program, arch_name)
    report = ScanReport(
        arch=arch_name,
        rule=the_rule.name,
        hazards=[],
        stores_checked=result.stores_checked,
        info=[
            _info(program, s, f, file)
            for s, f in zip(result.info, result.info_findings, strict=True)
        ],
        file=file,
        kernels=list(dict.fromkeys(program.kernels)),
        has_code=bool(program.instructions),
        arch_status=status,
    )
    if note:
        report.notes.append(note)
    if not program.instructions:
        report.notes.append("no AMDGCN instructions found")
    report.hazards = [_hazard(program, f, file) for f in result.findings]
    return report


def _hazard(program: Program, f: Finding, file: str | None) -> Hazard:
    return Hazard(
        kernel=program.kernel_of(f.store),
        line=f.store.line,
        store=f.store.text,
        writer=f.writer.text,
        writer_line=f.writer.line,
        wait_states=f.wait_states,
        required=f.required,
        path=_path_text(program, f.path),
        file=file,
    )


def _info(program: Program, site: StoreSite, f: Finding | None, file: str | None) -> StoreInfo:
    ins = site.instruction
    if f is None:
        return StoreInfo(program.kernel_of(ins), ins.line, ins.text, site.kind, file)
    return StoreInfo(
        program.kernel_of(ins), ins.line, ins.text, site.kind, file,
        writer=f.writer.text, writer_line=f.writer.line, wait_states=f.wait_states,
        required=f.required,
    )


_FUNCTION_RE = re.compile(rb"^[ \t]*\.type[ \t]+([\w.$]+)[ \t]*,[ \t]*@function", re.M)
_SIZE_RE = re.compile(rb"^[ \t]*\.size[ \t]+([\w.$]+)[ \t]*,", re.M)


def cut_kernels(text: str | bytes) -> list[str]:
    """Kernels whose ``.size`` directive the text never reaches: a file truncated inside them."""
    data = text.encode("utf-8", errors="replace") if isinstance(text, str) else bytes(text)
    ended = set(_SIZE_RE.findall(data))
    return [name.decode("utf-8", errors="replace") for name in
            dict.fromkeys(_FUNCTION_RE.findall(data)) if name not in ended]


def note_cut_kernels(report: ScanReport, text: str | bytes) -> ScanReport:
    """Record cut kernels in ``report`` (a file on disk can be cut; compiler text cannot)."""
    report.cut_kernels = cut_kernels(text) if report.has_code else []
    for name in report.cut_kernels:
        report.notes.append(
            f"{report.file or 'the text'} ends before its kernel {name} does (no .size "
            "directive after it): the file is truncated; only the part present was scanned")
    return report


def scan_text(
    text: str | bytes,
    *,
    arch: str | None = None,
    rule: str | Rule = DEFAULT_HAZARD_RULE,
    file: str | None = None,
) -> ScanReport:
    """Scan AMDGCN assembly ``text`` for hazardous buffer stores; never raises on odd text, only
    ValueError for an unknown ``rule``. An unknown arch is scanned as if affected."""
    the_rule = get_rule(rule)
    if isinstance(the_rule, StoreDataRule):
        # Most kernels are clean: prove it from the few lines after each store, and parse
        # the whole text only for a possible hazard (to report it with kernel and path).
        view = TextView(text)
        arch_name = normalize_arch(arch) if arch else view.arch
        quick = the_rule.quick_check(view, arch_name)
        if quick is not None:
            return _quick_report(view, quick, arch_name, the_rule.name, file)
        return scan_program(parse(view.text[1:]), arch=arch, rule=rule, file=file)
    return scan_program(parse(text), arch=arch, rule=rule, file=file)


def _quick_report(
    view: TextView, result: RuleResult, arch: str | None, rule: str, file: str | None
) -> ScanReport:
    status, note = _arch_status(arch)
    functions = view.function_labels()
    info = []
    if result.info:
        lines = view.line_numbers(result.info_offsets)
        starts = [off for off, _ in functions]
        for site, offset, line in zip(result.info, result.info_offsets, lines, strict=True):
            k = bisect.bisect_left(starts, offset) - 1
            kernel = functions[k][1] if k >= 0 else None
            info.append(StoreInfo(kernel, line, site.instruction.text, site.kind, file))
    has_code = bool(result.stores_checked or info)
    if not has_code:
        has_code = next(view.walk(0), None) is not None
    report = ScanReport(
        arch=arch,
        rule=rule,
        hazards=[],
        stores_checked=result.stores_checked,
        info=info,
        file=file,
        kernels=list(dict.fromkeys(name for _, name in functions)),
        has_code=has_code,
        arch_status=status,
    )
    if note:
        report.notes.append(note)
    if not has_code:
        report.notes.append("no AMDGCN instructions found")
    return report


# Positive evidence that a text is AMDGCN assembly: an AMDGPU target or kernel directive,
# and instructions of AMDGCN's encodings (scalar, vector, memory) at the start of a line.
_DIRECTIVE_RE = re.compile(
    r"^[ \t]*\.(?:amdgcn_target|amdhsa_kernel|amdgpu_hsa_kernel|amdhsa_code_object_version)\b",
    re.M,
)
_AMDGCN_INSTRUCTION_RE = re.compile(
    r"^[ \t]*(?:[sv]|buffer|tbuffer|global|flat|scratch|ds|image)_[a-z][a-z0-9_]*(?=[ \t;\r]|$)",
    re.M | re.I,
)
_CODE_LINE_RE = re.compile(r"^[ \t]*[A-Za-z_][\w.]*(?=[ \t;\r]|$)", re.M)
MIN_BARE_INSTRUCTIONS = 8
"""Instructions a bare listing (no AMDGPU directive) needs before it counts as AMDGCN."""


def not_amdgcn(data: str | bytes) -> str | None:
    """Why ``data`` is not AMDGCN assembly text, or None; recognised positively, so an ELF or junk
    that happens to parse is refused."""
    raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
    if raw.startswith(b"\x7fELF"):
        return "an ELF object (a .hsaco?), not assembly text: scan the .amdgcn beside it"
    if b"\x00" in raw:
        return "binary data (NUL bytes), not assembly text"
    text = raw.decode("utf-8", "replace")
    if not text.strip():
        return "empty"
    instructions = sum(1 for _ in _AMDGCN_INSTRUCTION_RE.finditer(text))
    if instructions == 0:
        return "no AMDGCN instructions"
    if _DIRECTIVE_RE.search(text):
        return None
    lines = sum(1 for _ in _CODE_LINE_RE.finditer(text))
    if instructions >= MIN_BARE_INSTRUCTIONS and 2 * instructions >= lines:
        return None
    return (f"no .amdgcn_target or .amdhsa_kernel directive and only {instructions} AMDGCN "
            f"instruction(s) among {lines} instruction-like line(s)")


@dataclass
class Search:
    """What a search of scan paths found: files to scan once each, and what it skipped."""

    seen: set[tuple[int, int]] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    """``"<path>: <why>"`` for each thing left out unscanned (dangling link, special file...)."""
    notes: list[str] = field(default_factory=list)
    """``"<path>: <why>"`` for each path reached twice: nothing left out."""

    def take(self, st: os.stat_result) -> bool:
        """True the first time this file or directory is reached."""
        key = (st.st_dev, st.st_ino)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def find_amdgcn_files(
    path: str | os.PathLike[str], search: Search | None = None
) -> Iterator[Path]:
    """``path`` itself, or every ``*.amdgcn`` below it, sorted; each taken once so symlink loops
    end, and what is skipped is said in ``search``. FileNotFoundError for a missing path."""
    search = search if search is not None else Search()
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        target = f" (a dangling symlink to {os.readlink(p)!r})" if p.is_symlink() else ""
        raise FileNotFoundError(f"no such file or directory: {str(p)!r}{target}") from None
    if not search.take(st):
        search.notes.append(f"{p}: reached before (given twice, or through a link): "
                            "scanned once")
        return
    if not stat.S_ISDIR(st.st_mode):
        yield p
        return
    found: list[Path] = []

    def unreadable(exc: OSError) -> None:
        search.skipped.append(f"{exc.filename}: cannot read ({exc.strerror or exc}): skipped")

    for root, dirs, files in os.walk(p, onerror=unreadable, followlinks=True):
        kept = []
        for d in sorted(dirs):
            sub = Path(root, d)
            try:
                sub_st = sub.stat()
            except OSError as exc:
                search.skipped.append(f"{sub}: cannot read ({exc.strerror or exc}): skipped")
                continue
            if search.take(sub_st):
                kept.append(d)
            elif sub.is_symlink():
                search.notes.append(
                    f"{sub}: a symlink to a directory already scanned ({os.readlink(sub)}): "
                    "not followed again"
                )
        dirs[:] = kept
        for name in files:
            if not name.endswith(".amdgcn"):
                continue
            f = Path(root, name)
            try:
                f_st = f.stat()
            except FileNotFoundError:
                search.skipped.append(
                    f"{f}: a dangling symlink to {os.readlink(f)!r}: skipped"
                    if f.is_symlink() else f"{f}: vanished while scanning: skipped"
                )
                continue
            except OSError as exc:
                search.skipped.append(f"{f}: cannot read ({exc.strerror or exc}): skipped")
                continue
            if not stat.S_ISREG(f_st.st_mode):
                search.skipped.append(
                    f"{f}: {describe_mode(f_st.st_mode)}, not a regular file: skipped")
            elif search.take(f_st):
                found.append(f)
    yield from sorted(found)


def scan_path(
    path: str | os.PathLike[str], *, arch: str | None = None, rule: str | Rule = DEFAULT_HAZARD_RULE
) -> list[ScanReport]:
    """Scan an ``.amdgcn`` file or directory; one report per file. FileNotFoundError, OSError or
    ValueError (unknown rule)."""
    the_rule = get_rule(rule)
    reports = []
    for f in find_amdgcn_files(path):
        data = read_regular(f)
        reports.append(scan_text(data, arch=arch, rule=the_rule, file=str(f)))
    return reports
