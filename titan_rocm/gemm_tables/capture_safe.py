"""``capture-safe``: copy aiter tuned BF16 GEMM tables without the rows unsafe under capture.

Every input is read and judged before anything is written, so a bad input leaves
no output behind. Every output is written to a temporary file in the output directory
first and only then renamed over its destination (:func:`write_all`), so no reader ever
sees a partial table and a full disk or Ctrl-C while writing changes no destination.
Docs: docs/gemm-tables.md.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from titan_rocm.archs import ARCHS, ArchFacts, normalize_arch
from titan_rocm.files import PartialWrite, write_all
from titan_rocm.gemm_tables.policy import POLICIES, ArchError, judge, row_arch
from titan_rocm.gemm_tables.table import GemmTableError, Table, read_table

AITER_GEMM_CONFIG_ENV = "AITER_CONFIG_GEMM_BF16"
"""aiter's list of tuned BF16 GEMM tables, joined by ``:``."""


class CaptureSafeError(ValueError):
    """Bad input or output for the operation (message says what and what is accepted)."""


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

    def to_dict(self) -> dict[str, object]:
        """JSON-able form."""
        return {
            "line": self.line,
            "arch": self.arch,
            "cu_num": self.cu_num,
            "libtype": self.libtype,
            "solidx": self.solidx,
            "kernelName": self.kernel_name,
            "detail": self.detail,
        }


@dataclass
class FileResult:
    """What the operation decided for one input table."""

    table: Table
    output: Path | None
    kept_bytes: bytes
    counts: Counter[tuple[str, str, bool]] = field(default_factory=Counter)
    """(arch, libtype, removed) → rows."""
    removed: list[RowNote] = field(default_factory=list)
    disagreements: list[RowNote] = field(default_factory=list)
    unknown_cu_nums: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(arch, cu_num) → rows judged as that arch (by gfx or --arch) although
    titan_rocm.archs does not list that cu_num for it."""

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
    files: list[FileResult]

    @property
    def unsafe_rows(self) -> int:
        """Rows removed (or, with ``check``, that would be removed) across all files."""
        return sum(f.removed_rows for f in self.files)

    @property
    def disagreements(self) -> int:
        """Rows whose kernelName and solidx disagree about split-K, across all files."""
        return sum(len(f.disagreements) for f in self.files)

    def env_line(self) -> str | None:
        """``AITER_CONFIG_GEMM_BF16=...`` for the written files (``None`` when nothing written)."""
        outputs = [str(f.output) for f in self.files if f.output is not None]
        return f"{AITER_GEMM_CONFIG_ENV}={':'.join(outputs)}" if outputs else None

    def to_dict(self) -> dict[str, object]:
        """JSON-able report of this run (what ``--json`` prints)."""
        unknown: Counter[tuple[str, str]] = Counter()
        for file_result in self.files:
            unknown.update(file_result.unknown_cu_nums)
        total = totals(self)
        return {
            "policy": self.policy,
            "check": self.check,
            "arch_override": self.arch_override,
            "rows": sum(total.values()),
            "unsafe_rows": self.unsafe_rows,
            "disagreements": self.disagreements,
            "files": [
                {
                    "input": str(f.table.path),
                    "output": None if f.output is None else str(f.output),
                    "has_gfx_column": f.table.has_gfx,
                    "rows": f.rows,
                    "kept": f.rows - f.removed_rows,
                    "removed": f.removed_rows,
                    "counts": _count_rows(f.counts),
                    "removed_rows": [n.to_dict() for n in f.removed],
                    "disagreements": [n.to_dict() for n in f.disagreements],
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


def judge_table(
    table: Table,
    policy: str,
    arch_override: str | None = None,
    archs: Mapping[str, ArchFacts] = ARCHS,
) -> FileResult:
    """Decide every row of ``table``; return the counts, notes and surviving bytes.

    Raises:
        CaptureSafeError: an opus row whose architecture is unknown or ambiguous, or
            whose solidx is not an integer.
    """
    kept: list[bytes] = [table.header.raw]
    result = FileResult(table=table, output=None, kept_bytes=b"")
    for record in table.records:
        fields = record.fields
        if fields is None:  # blank line: not a row, kept as it was
            kept.append(record.raw)
            continue
        libtype = fields["libtype"].strip()
        where = f"{table.path}:{record.line}"
        unsafe, reason, disagreement = False, "", ""
        try:
            arch = row_arch(fields, arch_override, archs)
        except ArchError as exc:
            # Only opus rows can be unsafe, so only they need a known arch; the others
            # are kept and counted under a visible label.
            if libtype.lower() == "opus":
                raise CaptureSafeError(f"{where}: opus row: {exc}") from None
            arch = _label(fields)
        else:
            facts = archs[arch]
            try:
                verdict = judge(fields, facts, policy)
            except ValueError as exc:
                raise CaptureSafeError(f"{where}: {exc}") from None
            unsafe, reason, disagreement = verdict.unsafe, verdict.reason, verdict.disagreement
            # A gfx value or --arch can name an arch whose cu_nums (titan_rocm.archs)
            # do not include the row's cu_num: worth a note, archs.py may be stale.
            cu_num = fields["cu_num"].strip()
            if not cu_num.isdigit() or int(cu_num) not in facts.cu_nums:
                result.unknown_cu_nums[(arch, cu_num)] += 1
        result.counts[(arch, libtype, unsafe)] += 1
        if disagreement:
            result.disagreements.append(_note(record.line, arch, fields, disagreement))
        if unsafe:
            result.removed.append(_note(record.line, arch, fields, reason))
        else:
            kept.append(record.raw)
    result.kept_bytes = b"".join(kept)
    return result


def _note(line: int, arch: str, fields: Mapping[str, str], detail: str) -> RowNote:
    return RowNote(
        line=line,
        arch=arch,
        cu_num=fields["cu_num"].strip(),
        libtype=fields["libtype"].strip(),
        solidx=fields["solidx"].strip(),
        kernel_name=fields["kernelName"].strip(),
        detail=detail,
    )


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def plan_outputs(inputs: Sequence[Path], outdir: Path) -> list[Path]:
    """The output path for each input (``outdir/<same name>``), after safety checks.

    Raises:
        CaptureSafeError: two inputs share a name, an output would be its input (or any
            input), ``outdir`` is not a directory, or a path contains ``:`` (the
            separator of AITER_CONFIG_GEMM_BF16).
    """
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
) -> Result:
    """Judge every table in ``inputs``; unless ``check``, write the safe copies to ``outdir``.

    Args:
        inputs: tuned BF16 GEMM CSV tables.
        outdir: where the copies go, under the same names (created if missing);
            ignored with ``check``.
        policy: ``splitk-opus`` or ``all-opus`` (see :data:`policy.POLICIES`).
        arch: the architecture of rows without a ``gfx`` value (``--arch``).
        check: decide only; write nothing.
        archs: per-arch facts (tests pass their own).

    Raises:
        CaptureSafeError: any bad input, output or option; nothing has been written,
            except when renaming the finished tables into place fails midway (the
            message names the tables written and those not).
        CaptureSafeInterrupted: Ctrl-C; it says which tables were written (none unless
            it came among the final renames).
    """
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
    paths = [Path(p) for p in inputs]
    outputs: list[Path | None] = [None] * len(paths)
    if not check:
        if outdir is None:
            raise CaptureSafeError("an output directory (-o OUTDIR) is required unless --check")
        outputs = list(plan_outputs(paths, Path(outdir)))
    results: list[FileResult] = []
    try:
        for path, output in zip(paths, outputs, strict=True):
            try:
                table = read_table(path)
            except GemmTableError as exc:
                raise CaptureSafeError(str(exc)) from None
            file_result = judge_table(table, policy, arch_name, archs)
            file_result.output = output
            results.append(file_result)
    except KeyboardInterrupt:  # still reading: nothing has been written
        raise CaptureSafeInterrupted([], [o for o in outputs if o is not None]) from None
    if not check:
        files = [(f.output, f.kept_bytes) for f in results if f.output is not None]
        try:
            Path(outdir).mkdir(parents=True, exist_ok=True)  # type: ignore[arg-type]
            write_all(files)
        except PartialWrite as exc:
            if isinstance(exc.cause, KeyboardInterrupt):
                raise CaptureSafeInterrupted(exc.written, exc.not_written) from None
            if not isinstance(exc.cause, OSError):
                raise exc.cause from None
            raise CaptureSafeError(
                f"cannot write to {outdir}: {exc.cause}; "
                f"{written_text(exc.written, exc.not_written)}"
            ) from None
        except OSError as exc:  # the directory itself
            raise CaptureSafeError(f"cannot write to {outdir}: {exc}; nothing written") from None
    return Result(policy=policy, check=check, arch_override=arch_name, files=results)


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
