"""Hazard rules over a parsed AMDGCN :class:`~.amdgcn.Program`: the VMEM store data hazard (LLVM
``GCNHazardRecognizer`` ``checkVALUHazardsHelper``; llvm-project PR #197267).

A MUBUF/MTBUF store of more than 64 bits reads its data registers after it issues, so a VALU write
to them needs wait states first (docs/triton-buffer-store-hazard.md gives the rules)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from titan_rocm.archs import gfx9_waitcnt_vmcnt, stores_counted_by_vmcnt
from titan_rocm.scanner.amdgcn import (
    Instruction,
    Program,
    Reg,
    TextView,
    parse_register,
)
from titan_rocm.scanner.names import RULE_NAMES

__all__ = [
    "StoreSite",
    "Finding",
    "RuleResult",
    "Rule",
    "StoreDataRule",
    "RULES",
    "CLI_RULES",
    "get_rule",
    "store_site",
]

_BUFFER_STORE_PREFIXES = ("buffer_store", "tbuffer_store", "buffer_atomic")
_ADDR_FIRST_PREFIXES = ("global_store", "flat_store", "scratch_store")
# Registers an SGPR-form ``soffset`` can name.
_SGPR_FILES = frozenset(
    {"s", "ttmp", "m0", "vcc", "vcc_lo", "vcc_hi", "exec", "exec_lo", "exec_hi",
     "flat_scratch", "flat_scratch_lo", "flat_scratch_hi", "xnack_mask", "tba", "tma"}
)


@dataclass(frozen=True)
class StoreSite:
    """A vector-memory store and the registers holding its data."""

    instruction: Instruction
    kind: str
    """``buffer`` (MUBUF/MTBUF: the hazard applies) or ``global``/``flat``/``scratch``."""
    data: tuple[Reg, ...]
    soffset: str | None
    sgpr_soffset: bool

    @property
    def data_dwords(self) -> int:
        """Number of 32-bit data registers."""
        return sum(r.count for r in self.data)


def store_site(ins: Instruction) -> StoreSite | None:
    """``ins`` as a VMEM store with vector data, or None; buffer atomics count too, as in LLVM."""
    m = ins.mnemonic
    if m.startswith(_BUFFER_STORE_PREFIXES):
        data = tuple(r for r in ins.regs(0) if r.is_vector)
        if not data:
            return None
        ops = ins.operands
        soffset = ops[3] if len(ops) > 3 else None
        soff_regs = parse_register(soffset) if soffset else ()
        sgpr = bool(soff_regs) and all(r.file in _SGPR_FILES for r in soff_regs)
        return StoreSite(ins, "buffer", data, soffset, sgpr)
    if m.startswith(_ADDR_FIRST_PREFIXES):
        data = tuple(r for r in ins.regs(1) if r.is_vector)
        if not data:
            return None
        return StoreSite(ins, m.split("_", 1)[0], data, None, False)
    return None


@dataclass(frozen=True)
class Finding:
    """A hazardous store as a rule sees it (scan.Hazard adds file and kernel)."""

    store: Instruction
    writer: Instruction
    wait_states: int
    required: int
    path: tuple[int, ...]


@dataclass
class RuleResult:
    """What a rule found in one program."""

    findings: list[Finding] = field(default_factory=list)
    stores_checked: int = 0
    info: list[StoreSite] = field(default_factory=list)
    """Wide global/flat/scratch stores: information only, recompiling cannot remove them."""
    info_findings: list[Finding | None] = field(default_factory=list)
    """Per ``info`` store: a VALU write of its data within 2 wait states, or None."""
    info_offsets: list[int] = field(default_factory=list)


class Rule:
    """A hazard rule: subclass and implement :meth:`check`."""

    name: str = ""
    description: str = ""

    def check(self, program: Program, arch: str | None = None) -> RuleResult:
        """Return the hazards of ``program`` compiled for ``arch`` (None: unknown)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<rule {self.name}>"


_VMCNT_RE = re.compile(r"vmcnt\(\s*(0x[0-9a-f]+|\d+)\s*\)", re.IGNORECASE)
_INT_RE = re.compile(r"^(0x[0-9a-f]+|\d+)$", re.IGNORECASE)


def _int(text: str) -> int | None:
    t = text.strip()
    if not _INT_RE.match(t):
        return None
    return int(t, 16) if t.lower().startswith("0x") else int(t, 10)


def retires_all_stores(ins: Instruction, arch: str | None = None) -> bool:
    """A wait that completes every earlier store (vmcnt 0, vscnt 0, storecnt 0)."""
    m = ins.mnemonic
    if m == "s_waitcnt":
        if not stores_counted_by_vmcnt(arch):
            return False
        found = _VMCNT_RE.search(ins.args)
        if found:
            return int(found.group(1), 0) == 0
        imm = _int(ins.args) if ins.args else None
        if imm is None:
            return False  # lgkmcnt/expcnt only: vmcnt left at its maximum
        return gfx9_waitcnt_vmcnt(imm) == 0
    if m == "s_waitcnt_vscnt":
        ops = ins.operands
        return bool(ops) and _int(ops[-1]) == 0
    if m == "s_wait_storecnt":
        ops = ins.operands
        return bool(ops) and _int(ops[0]) == 0
    return False


def _any_vmem_wait(ins: Instruction, arch: str | None = None) -> bool:
    m = ins.mnemonic
    if m == "s_waitcnt":
        return "vmcnt" in ins.args.lower() or _int(ins.args) is not None
    return m in ("s_waitcnt_vscnt", "s_wait_storecnt")


class StoreDataRule(Rule):
    """The VMEM store data hazard, parameterised by window, writers and retiring waits.

    Every control path after a wide store is followed, because branchy code is where LLVM dropped
    the protective ``s_nop`` (llvm-project #203770)."""

    def __init__(
        self,
        name: str,
        description: str,
        *,
        sgpr_window: int | None,
        literal_window: int | None,
        writes: Callable[[Instruction], tuple[Reg, ...]] = Instruction.valu_vector_defs,
        retires: Callable[[Instruction, str | None], bool] = retires_all_stores,
        flat_window: int | None = 2,
    ) -> None:
        self.name = name
        self.description = description
        self.sgpr_window = sgpr_window
        """With an SGPR soffset (None: until a retiring wait)."""
        self.literal_window = literal_window
        """With a literal or absent soffset (None: unbounded)."""
        self.flat_window = flat_window
        """After wide global/flat/scratch stores (information only; None: not checked)."""
        self.writes = writes
        self.retires = retires

    def quick_check(self, view: TextView, arch: str | None = None) -> RuleResult | None:
        """:meth:`check` without a full parse when the text is clean and simple; else None."""
        return _quick_check(self, view, arch)

    def required(self, site: StoreSite) -> int | None:
        """Wait states this rule requires after ``site``."""
        if site.kind != "buffer":
            return self.flat_window
        return self.sgpr_window if site.sgpr_soffset else self.literal_window

    def check(self, program: Program, arch: str | None = None) -> RuleResult:
        result = RuleResult()
        for ins in program.memory_writes:
            site = store_site(ins)
            if site is None or site.data_dwords <= 2:
                continue
            if site.kind != "buffer":
                result.info.append(site)
                found = self._walk(program, site, arch) if self.flat_window else None
                result.info_findings.append(found)
                continue
            result.stores_checked += 1
            finding = self._walk(program, site, arch)
            if finding is not None:
                result.findings.append(finding)
        return result

    def _walk(self, program: Program, site: StoreSite, arch: str | None) -> Finding | None:
        """The writer with the fewest wait states over every path after the store."""
        window = self.required(site)
        store = site.instruction
        data = site.data
        blocks = program.blocks
        start_block = store.block
        best: Finding | None = None
        # Depth-first over (block, position, wait states so far, block path).
        stack: list[tuple[int, int, int, tuple[int, ...]]] = [
            (start_block, store.pos + 1, 0, (start_block,))
        ]
        seen: set[tuple[int, int, int]] = set()
        while stack:
            b, pos, ws, path = stack.pop()
            key = (b, pos, ws if window is not None else 0)
            if key in seen:
                continue
            seen.add(key)
            instrs = blocks[b].instructions
            stopped = False
            while pos < len(instrs):
                if window is not None and ws >= window:
                    stopped = True
                    break
                ins = instrs[pos]
                if any(d.overlaps(r) for d in self.writes(ins) for r in data):
                    if best is None or ws < best.wait_states:
                        best = Finding(store, ins, ws, window if window is not None else -1, path)
                    stopped = True
                    break
                if self.retires(ins, arch):
                    stopped = True
                    break
                ws += ins.wait_states
                pos += 1
            if stopped or (window is not None and ws >= window):
                continue
            for s in blocks[b].successors:
                stack.append((s, 0, ws, path + (s,)))
        return best


# Every mnemonic store_site() accepts contains one of these.
_MEMORY_WRITE_NEEDLES = ("_store", "_atomic")


def _quick_check(
    rule: StoreDataRule, view: TextView, arch: str | None
) -> RuleResult | None:
    """Prove ``view`` free of hazards without parsing all of it (caches are large), or None: parse
    fully. Equal to :meth:`StoreDataRule.check` whenever not None."""
    if rule.sgpr_window is None or rule.literal_window is None or not view.simple:
        return None
    result = RuleResult()
    for offset in view.lines_containing(_MEMORY_WRITE_NEEDLES):
        ins, after = view.instruction_at(offset)
        site = store_site(ins) if ins is not None else None
        if site is None or site.data_dwords <= 2:
            continue
        if site.kind != "buffer":
            if rule.flat_window and not _quick_safe(rule, view, site, after, arch):
                return None
            result.info.append(site)
            result.info_offsets.append(offset)
            result.info_findings.append(None)
            continue
        result.stores_checked += 1
        if not _quick_safe(rule, view, site, after, arch):
            return None
    return result


def _quick_safe(
    rule: StoreDataRule, view: TextView, site: StoreSite, start: int, arch: str | None
) -> bool:
    window = rule.required(site)
    assert window is not None
    data = site.data
    stack = [(start, 0)]
    seen: set[tuple[int, int]] = set()
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        offset, ws = state
        for ins, _next in view.walk(offset):
            if ws >= window:
                break
            if any(d.overlaps(r) for d in rule.writes(ins) for r in data):
                return False
            if rule.retires(ins, arch):
                break
            ws += ins.wait_states
            if ins.ends_path:
                break
            m = ins.mnemonic
            if m == "s_branch" or m.startswith("s_cbranch_"):
                found = view.label_offset(ins.branch_target or "")
                if found is not None and ws < window:
                    stack.append((found, ws))
                if m == "s_branch":
                    break
    return True


PRECISE = StoreDataRule(
    "precise",
    "VALU write of a >64-bit MUBUF/MTBUF store's data registers within 1 wait state (SGPR "
    "soffset) or 2 (literal soffset) of the store: the gfx940-family hardware rule",
    sgpr_window=1,
    literal_window=2,
)
CONSERVATIVE = StoreDataRule(
    "conservative",
    "VALU write of a >64-bit MUBUF/MTBUF store's data registers within 2 wait states, "
    "whatever the soffset",
    sgpr_window=2,
    literal_window=2,
)
NAIVE = StoreDataRule(
    "naive",
    "any redefinition of a >64-bit buffer store's data registers before an s_waitcnt on "
    "vmcnt (wrong: for comparison only)",
    sgpr_window=None,
    literal_window=None,
    writes=Instruction.vector_defs,
    retires=_any_vmem_wait,
    flat_window=None,
)

RULES: dict[str, Rule] = {r.name: r for r in (PRECISE, CONSERVATIVE, NAIVE)}
CLI_RULES: tuple[str, ...] = RULE_NAMES
"""Rules offered to users (``naive`` is a benchmark baseline, not a choice)."""


def get_rule(name: str | Rule) -> Rule:
    """The rule called ``name`` (a Rule passes through); raises ValueError for an unknown one."""
    if isinstance(name, Rule):
        return name
    try:
        return RULES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown hazard rule {name!r}; choose one of: {', '.join(RULES)}"
        ) from None
