"""Which tuned GEMM rows are unsafe under HIP-graph capture, and on which architecture.

aiter's split-K opus kernels keep their workspace in a per-stream hipMalloc registry, so a capture
that touches it first aborts the process (docs/gemm-tables.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from titan_rocm.archs import ARCHS, ArchFacts, normalize_arch

POLICIES: tuple[str, ...] = ("splitk-opus", "all-opus")
"""``splitk-opus`` (default): split-K opus rows only; ``all-opus``: the blunt fix seen in the wild,
kept for comparison."""

OPUS = "opus"


class ArchError(ValueError):
    """A row's architecture is unknown or cannot be told from its ``cu_num``."""


@dataclass(frozen=True)
class RowJudgement:
    """The decision about one row."""

    unsafe: bool
    reason: str
    disagreement: str
    """Non-empty when ``kernelName`` and ``solidx`` disagree about split-K (explains how)."""


def arches_for_cu_num(cu_num: str, archs: Mapping[str, ArchFacts] = ARCHS) -> list[str]:
    """The architectures whose ``cu_nums`` include ``cu_num`` (a table field, as text)."""
    try:
        value = int(cu_num.strip())
    except ValueError:
        return []
    return sorted(name for name, facts in archs.items() if value in facts.cu_nums)


def row_arch(
    fields: Mapping[str, str],
    arch_override: str | None,
    archs: Mapping[str, ArchFacts] = ARCHS,
) -> str:
    """The architecture a row applies to: its ``gfx``, else ``--arch``, else its ``cu_num``;
    ArchError when that is unknown or ambiguous."""
    known = ", ".join(sorted(archs))
    gfx = fields.get("gfx", "").strip()
    if gfx:
        name = normalize_arch(gfx)
        if name not in archs:
            raise ArchError(f"unknown gfx {gfx!r}; known: {known}")
        return name
    if arch_override is not None:
        return arch_override
    cu_num = fields.get("cu_num", "").strip()
    matches = arches_for_cu_num(cu_num, archs)
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ArchError(
            f"cu_num {cu_num!r} is used by several architectures ({', '.join(matches)}) and "
            "the row has no gfx; pass --arch to say which one the table is for"
        )
    mapping = "; ".join(
        f"{name}: {', '.join(map(str, facts.cu_nums))}"
        for name, facts in sorted(archs.items())
        if facts.cu_nums
    )
    raise ArchError(
        f"cu_num {cu_num!r} names no known architecture and the row has no gfx "
        f"(known cu_num values: {mapping}); pass --arch"
    )


def in_splitk_range(solidx: int, facts: ArchFacts) -> bool:
    """Whether ``solidx`` is the id of a capture-unsafe split-K opus kernel on that arch."""
    return any(low <= solidx < high for low, high in facts.opus_splitk_solidx_ranges)


def name_says_splitk(kernel_name: str) -> bool:
    """Whether an opus kernel's name marks it as split-K."""
    return "splitk" in kernel_name.lower()


def parse_integer(text: str, field: str) -> int:
    """An integer table field (``250`` or ``250.0``); raises ValueError naming ``field``."""
    value = text.strip()
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if number.is_integer():
        return int(number)
    raise ValueError(f"{field} {text!r} is not an integer")


def parse_solidx(text: str) -> int:
    """Parse a ``solidx`` field (:func:`parse_integer`)."""
    return parse_integer(text, "solidx")


def judge(fields: Mapping[str, str], facts: ArchFacts, policy: str) -> RowJudgement:
    """Whether the row ``fields`` is unsafe under ``policy``, by its ``solidx`` range.

    A split-K ``kernelName`` outside every range is removed too, flagged: a crash under capture
    costs more than one tuned row. ValueError for an unknown policy or a bad opus solidx."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of: {', '.join(POLICIES)}")
    if fields["libtype"].strip().lower() != OPUS or not facts.opus_splitk_solidx_ranges:
        return RowJudgement(False, "", "")
    solidx = parse_solidx(fields["solidx"])
    by_id = in_splitk_range(solidx, facts)
    by_name = name_says_splitk(fields["kernelName"])
    disagreement = ""
    if by_id and not by_name:
        disagreement = (
            f"solidx {solidx} is in a {facts.name} split-K range but the name lacks 'splitk'"
        )
    elif by_name and not by_id:
        disagreement = (
            f"the name says split-K but solidx {solidx} is outside the {facts.name} split-K "
            f"ranges {list(facts.opus_splitk_solidx_ranges)}"
        )
    if by_id or by_name:
        return RowJudgement(True, f"split-K opus kernel (solidx {solidx})", disagreement)
    if policy == "all-opus":
        return RowJudgement(True, f"opus kernel (solidx {solidx}), policy all-opus", disagreement)
    return RowJudgement(False, "", disagreement)
