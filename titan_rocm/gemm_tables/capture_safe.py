"""``capture-safe``: copy aiter tuned BF16 GEMM tables without the rows unsafe under capture
(docs/gemm-tables.md).

Rows stream into temporary files renamed into place only once every input is judged, so a bad input,
a full disk or Ctrl-C changes no destination and no reader sees a partial table."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from titan_rocm.archs import ARCHS, ArchFacts, normalize_arch
from titan_rocm.files import PartialWrite, write_all
from titan_rocm.gemm_tables.policy import POLICIES, ArchError, judge, row_arch
from titan_rocm.gemm_tables.rules import RULES, AiterRules, rules_for
from titan_rocm.gemm_tables.table import GemmTableError, Table, read_table
from titan_rocm.serial import json_form

AITER_GEMM_CONFIG_ENV = "AITER_CONFIG_GEMM_BF16"
"""aiter's list of tuned BF16 GEMM tables, joined by ``:``."""


class CaptureSafeError(ValueError):
    """Bad input or output: the message says what and what is accepted."""

class CaptureSafeInterrupted(Exception):
    """Ctrl-C stopped the operation; ``written`` and ``not_written`` are the output paths."""

    def __init__(self, written: Sequence[Path], not_written: Sequence[Path]) -> None:
        self.written, self.not_written = list(written), list(not_written)
        super().__init__(written_text(self.written, self.not_written))


def written_text(written: Sequence[Path], not_written: Sequence[Path]) -> str:
    """``written: a, b; not written: c`` (or ``nothing written``) for a message."""
    if not written:
        return "nothing written"
    text = f"written {len(written)} of {len(written) + len(not_written)} table(s): "
    text += ", ".join(str(p) for p in written)
    if not_written:
        text += "; not written: " + ", ".join(str(p) for p in not_written)
    return text


MAX_NOTES = 10_000
"""Rows listed per run; beyond it rows are only counted, so memory stays flat."""


@dataclass(frozen=True)
class RowNote:
    """A row worth showing: removed, or with a kernelName/solidx disagreement."""

    line: int
    arch: str
    cu_num: str
    libtype: str
    solidx: str
    kernel_name: str
    detail: str
    rule: str = ""
    """Empty for a disagreement note."""

    def to_dict(self) -> dict[str, object]:
        return json_form(self, "line arch cu_num libtype solidx kernelName=kernel_name rule detail")


@dataclass
class Notes:
    """One file's listed rows, within a budget all files of a run share."""

    budget: list[int] = field(default_factory=lambda: [MAX_NOTES])
    kept: list[RowNote] = field(default_factory=list)
    not_listed: int = 0

    def add(self, note: RowNote) -> None:
        """List ``note``, or count it once the budget is spent."""
        if self.budget[0] > 0:
            self.budget[0] -= 1
            self.kept.append(note)
        else:
            self.not_listed += 1

    def __len__(self) -> int:
        return len(self.kept) + self.not_listed


@dataclass
class FileResult:
    """What the operation decided for one input table."""

    path: Path
    output: Path | None
    has_gfx: bool = False
    counts: Counter[tuple[str, str, bool]] = field(default_factory=Counter)
    by_rule: Counter[str] = field(default_factory=Counter)
    fixed_by_rule: Counter[str] = field(default_factory=Counter)
    """Rule name → rows it would remove, kept because the rule does not hold."""
    removed: Notes = field(default_factory=Notes)
    disagreements: Notes = field(default_factory=Notes)
    unknown_cu_nums: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(arch, cu_num) → rows judged as an arch that titan_rocm.archs lacks that cu_num for."""

    @property
    def rows(self) -> int:
        """Data rows read."""
        return sum(self.counts.values())

    @property
    def removed_rows(self) -> int:
        """Data rows removed."""
        return len(self.removed)


@dataclass
class Result:
    """The outcome of one ``capture-safe`` run."""

    policy: str
    check: bool
    arch_override: str | None
    aiter: AiterRules
    files: list[FileResult]

    @property
    def unsafe_rows(self) -> int:
        """Rows removed (or, with ``check``, that would be removed)."""
        return sum(f.removed_rows for f in self.files)

    @property
    def disagreements(self) -> int:
        """Rows whose kernelName and solidx disagree about split-K, across all files."""
        return sum(len(f.disagreements) for f in self.files)

    def rule_counts(self) -> list[dict[str, object]]:
        """Per rule: whether it holds, why, rows removed and rows it would remove if held."""
        removed: Counter[str] = Counter()
        fixed: Counter[str] = Counter()
        for f in self.files:
            removed.update(f.by_rule)
            fixed.update(f.fixed_by_rule)
        return [
            {**state.to_dict(), "removed": removed[state.rule.name],
             "kept_as_fixed": fixed[state.rule.name]}
            for state in self.aiter.states
        ]

    def env_line(self) -> str | None:
        """None when nothing was written."""
        outputs = [str(f.output) for f in self.files if f.output is not None]
        return f"{AITER_GEMM_CONFIG_ENV}={':'.join(outputs)}" if outputs else None

    def to_dict(self) -> dict[str, object]:
        """What ``--json`` prints."""
        unknown: Counter[tuple[str, str]] = Counter()
        for file_result in self.files:
            unknown.update(file_result.unknown_cu_nums)
        total = totals(self)
        return {
            "ok": True,
            "policy": self.policy,
            "check": self.check,
            "arch_override": self.arch_override,
            "aiter": self.aiter.known_as,
            "rules": self.rule_counts(),
            "rows": sum(total.values()),
            "unsafe_rows": self.unsafe_rows,
            "disagreements": self.disagreements,
            "files": [
                {
                    "input": str(f.path),
                    "output": None if f.output is None else str(f.output),
                    "has_gfx_column": f.has_gfx,
                    "rows": f.rows,
                    "kept": f.rows - f.removed_rows,
                    "removed": f.removed_rows,
                    "removed_by_rule": dict(sorted(f.by_rule.items())),
                    "counts": _count_rows(f.counts),
                    "removed_rows": [n.to_dict() for n in f.removed.kept],
                    "removed_rows_not_listed": f.removed.not_listed,
                    "disagreements": [n.to_dict() for n in f.disagreements.kept],
                    "disagreements_not_listed": f.disagreements.not_listed,
                }
                for f in self.files
            ],
            "totals": _count_rows(total),
            "cu_nums_not_in_archs": [
                {"arch": arch, "cu_num": cu_num, "rows": rows}
                for (arch, cu_num), rows in sorted(unknown.items())
            ],
            "env": self.env_line(),
        }


def _label(fields: Mapping[str, str]) -> str:
    # A row whose arch does not matter to the decision (not opus) is still counted
    # under a visible label rather than refused.
    gfx = fields.get("gfx", "").strip()
    return gfx or f"cu_num={fields.get('cu_num', '').strip()}"


def judge_rows(
    table: Table,
    result: FileResult,
    policy: str,
    rules: AiterRules,
    arch_override: str | None = None,
    archs: Mapping[str, ArchFacts] = ARCHS,
) -> Iterator[bytes]:
    """Yield the bytes of ``table`` that survive (header first), counting into ``result``;
    CaptureSafeError for a row that cannot be judged."""
    holding = {rule.name for rule in rules.holding()}
    result.has_gfx = table.has_gfx
    yield table.header.raw
    try:
        for record in table.records():
            fields = record.fields
            if fields is None:  # blank line: not a row, kept as it was
                yield record.raw
                continue
            if _judge_row(table, record.line, fields, result, policy, holding, arch_override,
                          archs):
                yield record.raw
    except GemmTableError as exc:
        raise CaptureSafeError(str(exc)) from None


def _judge_row(table: Table, line: int, fields: Mapping[str, str], result: FileResult,
               policy: str, holding: set[str], arch_override: str | None,
               archs: Mapping[str, ArchFacts]) -> bool:
    """Count one row into ``result``; whether it is kept."""
    libtype = fields["libtype"].strip()
    where = f"{table.path}:{line}"
    facts: ArchFacts | None = None
    try:
        arch = row_arch(fields, arch_override, archs)
    except ArchError as exc:
        # Only opus rows need a known arch (their kernel ids are per arch); the others
        # are judged without one and counted under a visible label.
        if libtype.lower() == "opus":
            raise CaptureSafeError(f"{where}: opus row: {exc}") from None
        arch = _label(fields)
    else:
        facts = archs[arch]
        # A gfx value or --arch can name an arch whose cu_nums (titan_rocm.archs)
        # do not include the row's cu_num: worth a note, archs.py may be stale.
        cu_num = fields["cu_num"].strip()
        if not cu_num.isdigit() or int(cu_num) not in facts.cu_nums:
            result.unknown_cu_nums[(arch, cu_num)] += 1
    try:
        if facts is not None and libtype.lower() == "opus":
            disagreement = judge(fields, facts, policy).disagreement
            if disagreement:
                result.disagreements.add(_note(line, arch, fields, disagreement))
        removed_by = ""
        for rule in RULES:
            reason = rule.matches(fields, facts, policy)
            if reason is None:
                continue
            if rule.name in holding:
                removed_by = rule.name
                result.removed.add(_note(line, arch, fields, reason, rule.name))
                break
            result.fixed_by_rule[rule.name] += 1
    except ValueError as exc:
        raise CaptureSafeError(f"{where}: {exc}") from None
    result.counts[(arch, libtype, bool(removed_by))] += 1
    if removed_by:
        result.by_rule[removed_by] += 1
    return not removed_by


def _note(line: int, arch: str, fields: Mapping[str, str], detail: str,
          rule: str = "") -> RowNote:
    return RowNote(
        line=line,
        arch=arch,
        cu_num=fields["cu_num"].strip(),
        libtype=fields["libtype"].strip(),
        solidx=fields["solidx"].strip(),
        kernel_name=fields["kernelName"].strip(),
        detail=detail,
        rule=rule,
    )


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def plan_outputs(inputs: Sequence[Path], outdir: Path) -> list[Path]:
    """The output path for each input (``outdir/<same name>``).

    Raises CaptureSafeError for two inputs of one name, an output over an input, an ``outdir`` that
    is not a directory, or a ``:`` (AITER_CONFIG_GEMM_BF16's separator) in a path."""
    if outdir.exists() and not outdir.is_dir():
        raise CaptureSafeError(f"output directory {outdir} exists and is not a directory")
    outputs: list[Path] = []
    seen: dict[str, Path] = {}
    for path in inputs:
        if path.name in seen:
            raise CaptureSafeError(
                f"{seen[path.name]} and {path} have the same name; their outputs in {outdir} "
                "would overwrite each other"
            )
        seen[path.name] = path
        output = Path(os.path.abspath(outdir / path.name))
        if ":" in str(output):
            raise CaptureSafeError(
                f"output path {output} contains ':', which {AITER_GEMM_CONFIG_ENV} uses to "
                "separate paths"
            )
        for other in inputs:
            if _same_file(output, other):
                raise CaptureSafeError(
                    f"output {output} is the input {other}; choose an output directory "
                    "that holds none of the inputs"
                )
        outputs.append(output)
    return outputs


def capture_safe(
    inputs: Sequence[str | Path],
    outdir: str | Path | None,
    policy: str = "splitk-opus",
    arch: str | None = None,
    check: bool = False,
    archs: Mapping[str, ArchFacts] = ARCHS,
    aiter: str | None = None,
    rules: AiterRules | None = None,
) -> Result:
    """Judge every table in ``inputs``; unless ``check``, write the safe copies to ``outdir``.
    ``aiter`` None lets the installed aiter decide which rules hold.

    Raises CaptureSafeError (nothing written, unless renaming fails midway: the message names what
    was) or CaptureSafeInterrupted (Ctrl-C; it says which tables were written)."""
    if not inputs:
        raise CaptureSafeError("no table given")
    if policy not in POLICIES:
        raise CaptureSafeError(f"unknown policy {policy!r}; choose one of: {', '.join(POLICIES)}")
    arch_name = None
    if arch is not None:
        arch_name = normalize_arch(arch)
        if arch_name not in archs:
            known = ", ".join(sorted(archs))
            raise CaptureSafeError(f"unknown AMD GPU architecture {arch!r}; known: {known}")
    if rules is None:
        try:
            rules = rules_for(aiter)
        except ValueError as exc:
            raise CaptureSafeError(str(exc)) from None
    paths = [Path(p) for p in inputs]
    outputs: list[Path | None] = [None] * len(paths)
    if not check:
        if outdir is None:
            raise CaptureSafeError("an output directory (-o OUTDIR) is required unless --check")
        outputs = list(plan_outputs(paths, Path(outdir)))
    removed_budget, disagreement_budget = [MAX_NOTES], [MAX_NOTES]  # one per run
    results = [
        FileResult(path=path, output=output, removed=Notes(removed_budget),
                   disagreements=Notes(disagreement_budget))
        for path, output in zip(paths, outputs, strict=True)
    ]

    def surviving(file_result: FileResult) -> Iterator[bytes]:
        try:
            table = read_table(file_result.path)
        except GemmTableError as exc:
            raise CaptureSafeError(str(exc)) from None
        with table:
            yield from judge_rows(table, file_result, policy, rules, arch_name, archs)

    if check:
        try:
            for file_result in results:
                for _ in surviving(file_result):
                    pass
        except KeyboardInterrupt:
            raise CaptureSafeInterrupted([], []) from None
    else:
        _write(Path(outdir), [(f.output, surviving(f)) for f in results])  # type: ignore[arg-type]
    return Result(policy=policy, check=check, arch_override=arch_name, aiter=rules,
                  files=results)


def _write(outdir: Path, files: list[tuple[Path, Iterator[bytes]]]) -> None:
    created = not outdir.exists()
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # the directory itself
        raise CaptureSafeError(f"cannot write to {outdir}: {exc}; nothing written") from None
    try:
        write_all(files)
    except PartialWrite as exc:
        if created and not exc.written:
            _remove_empty(outdir)
        if isinstance(exc.cause, KeyboardInterrupt):
            raise CaptureSafeInterrupted(exc.written, exc.not_written) from None
        if isinstance(exc.cause, CaptureSafeError):
            raise exc.cause from None
        if not isinstance(exc.cause, OSError):
            raise exc.cause from None
        raise CaptureSafeError(
            f"cannot write to {outdir}: {exc.cause}; "
            f"{written_text(exc.written, exc.not_written)}"
        ) from None


def _remove_empty(directory: Path) -> None:
    # A run that wrote nothing leaves no directory of its own making behind.
    try:
        directory.rmdir()
    except OSError:
        pass


def _count_rows(counts: Counter[tuple[str, str, bool]]) -> list[dict[str, object]]:
    keys = sorted({(arch, libtype) for arch, libtype, _ in counts})
    return [
        {
            "arch": arch,
            "libtype": libtype,
            "kept": counts[(arch, libtype, False)],
            "removed": counts[(arch, libtype, True)],
        }
        for arch, libtype in keys
    ]


def totals(result: Result) -> Counter[tuple[str, str, bool]]:
    """(arch, libtype, removed) → rows, summed over all files."""
    total: Counter[tuple[str, str, bool]] = Counter()
    for file_result in result.files:
        total.update(file_result.counts)
    return total
