"""Public API: scan AMDGCN text or files for the buffer-store data hazard.

Used by the Triton compile wrapper (scan each HIP kernel's ``asm["amdgcn"]``, recompile
the hazardous ones) and by ``titan-rocm scan`` (audit a Triton/Inductor cache). Light:
imports neither torch nor triton.

    report = scan_text(kernel.asm["amdgcn"])
    if report.hazardous:
        ...  # recompile with buffer ops off
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from titan_rocm.archs import ARCHS, normalize_arch
from titan_rocm.workarounds.triton_war.amdgcn import Program, TextView, parse
from titan_rocm.workarounds.triton_war.hazards import (
    Finding,
    Rule,
    RuleResult,
    StoreDataRule,
    StoreSite,
    get_rule,
)

__all__ = [
    "Hazard",
    "StoreInfo",
    "ScanReport",
    "scan_text",
    "scan_program",
    "scan_path",
    "find_amdgcn_files",
]

# Arch verdicts in ScanReport.arch_status.
AFFECTED = "affected"
NOT_AFFECTED = "not-affected"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Hazard:
    """One hazardous store: a VALU instruction overwrites its data registers too soon."""

    kernel: str | None
    """The function label containing the store (the Triton kernel name)."""
    line: int
    """1-based line of the store in the text."""
    store: str
    """The store instruction as written, e.g. ``buffer_store_dwordx4 v[0:3], v36, s[8:11], 0
    offen``."""
    writer: str
    """The instruction that overwrites the data, e.g. ``v_pk_mul_f32 v[0:1], v[2:3], v[4:5]``."""
    writer_line: int
    wait_states: int
    """Wait states between store and writer on the worst path."""
    required: int
    """Wait states the rule requires (-1: the naive rule, unbounded)."""
    path: tuple[int, ...] | str
    """How control gets from the store to the writer: ``"straight line"``, or the branches
    taken/not taken, e.g. ``"s_cbranch_scc1 to .LBB0_1"`` (a loop back-edge)."""
    file: str | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON-able form (the ``--json`` output of ``titan-rocm scan``)."""
        return {
            "file": self.file,
            "line": self.line,
            "kernel": self.kernel,
            "kind": "buffer",
            "recompile_fixes": True,
            "store": self.store,
            "writer": self.writer,
            "writer_line": self.writer_line,
            "wait_states": self.wait_states,
            "required": self.required,
            "path": self.path if isinstance(self.path, str) else list(self.path),
        }


@dataclass(frozen=True)
class StoreInfo:
    """A global/flat/scratch store of more than 64 bits: informational only, since
    recompiling with buffer ops off cannot remove it (it is what that produces).

    These stores have the same hazard (LLVM protects them with 2 wait states on gfx940,
    and LLVM regressions have dropped that protection: llvm-project #202333). When a VALU
    instruction writes the data within 2 wait states, ``writer`` and ``wait_states`` say
    so: a real hazard that only a compiler fix removes.
    """

    kernel: str | None
    line: int
    store: str
    kind: str
    """``global``, ``flat`` or ``scratch``."""
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
        return {
            "file": self.file,
            "line": self.line,
            "kernel": self.kernel,
            "kind": self.kind,
            "recompile_fixes": False,
            "store": self.store,
            "writer": self.writer,
            "writer_line": self.writer_line,
            "wait_states": self.wait_states,
            "required": self.required,
            "path": None,
        }


@dataclass
class ScanReport:
    """The result of scanning one AMDGCN text with one rule."""

    arch: str | None
    """The architecture the text was scanned for (``gfx942``), None when unknown."""
    rule: str
    hazards: list[Hazard]
    stores_checked: int
    """MUBUF/MTBUF stores of more than 64 bits examined."""
    info: list[StoreInfo] = field(default_factory=list)
    file: str | None = None
    kernels: list[str] = field(default_factory=list)
    has_code: bool = False
    """The input held AMDGCN instructions (False: empty, junk, not assembly)."""
    arch_status: str = UNKNOWN
    """``affected`` (the arch has the hazard), ``not-affected`` (it does not: no hazard is
    reported), ``unknown`` (arch missing or unknown to titan-rocm: scanned as if affected)."""
    notes: list[str] = field(default_factory=list)
    """Human-readable remarks (unknown arch, arch not affected, no instructions...)."""

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
    if not facts.vmem_store_data_hazard:
        return NOT_AFFECTED, f"{arch} does not have the buffer-store data hazard: not reported"
    return AFFECTED, None


def _path_text(program: Program, path: tuple[int, ...]) -> str:
    """The branches a block path takes: ``straight line``, ``s_cbranch_scc1 to .LBB0_2``,
    ``s_cbranch_execz not taken, s_branch to .LBB0_5``..."""
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
    rule: str | Rule = "precise",
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
    if status != NOT_AFFECTED:
        report.hazards = [_hazard(program, f, file) for f in result.findings]
    elif result.findings:
        report.notes.append(
            f"{len(result.findings)} store(s) would match rule {the_rule.name!r} on an "
            "affected architecture"
        )
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


def scan_text(
    text: str | bytes,
    *,
    arch: str | None = None,
    rule: str | Rule = "precise",
    file: str | None = None,
) -> ScanReport:
    """Scan AMDGCN assembly ``text`` for hazardous buffer stores.

    Args:
        text: the assembly (``kernel.asm["amdgcn"]`` or a cache's ``.amdgcn`` file).
        arch: ``gfx942``... overrides the ``.amdgcn_target`` of the text.
        rule: ``precise`` (default), ``conservative``, ``naive`` (see ``hazards``), or a
            :class:`~.hazards.Rule` object.
        file: recorded in the report and its hazards.

    Never raises on odd text (junk, truncated, empty); raises ValueError for an unknown
    ``rule``. An unknown or missing arch is scanned as if affected and said so in
    ``notes``; an arch without the hazard (``archs.ArchFacts.vmem_store_data_hazard``)
    reports no hazards.
    """
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


def find_amdgcn_files(path: str | os.PathLike[str]) -> Iterator[Path]:
    """``path`` itself if it is a file, else every ``*.amdgcn`` below it, sorted.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
    """
    p = Path(path)
    if p.is_file():
        yield p
        return
    if not p.exists():
        raise FileNotFoundError(f"no such file or directory: {str(p)!r}")
    found: list[Path] = []
    for root, _dirs, files in os.walk(p, onerror=None):
        found.extend(Path(root, f) for f in files if f.endswith(".amdgcn"))
    yield from sorted(found)


def scan_path(
    path: str | os.PathLike[str], *, arch: str | None = None, rule: str | Rule = "precise"
) -> list[ScanReport]:
    """Scan an ``.amdgcn`` file, or every ``*.amdgcn`` under a directory (recursively).

    Returns one report per file (an empty list for a directory without ``.amdgcn`` files).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        OSError: a file cannot be read.
        ValueError: unknown ``rule``.
    """
    the_rule = get_rule(rule)
    reports = []
    for f in find_amdgcn_files(path):
        data = f.read_bytes()
        reports.append(scan_text(data, arch=arch, rule=the_rule, file=str(f)))
    return reports
