"""A small parser for AMDGCN assembly text (Triton's ``kernel.asm["amdgcn"]``), just enough for
hazard rules. :func:`parse` never raises, because the scanner reads any cache file."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Reg", "Instruction", "Block", "Program", "TextView", "parse", "parse_register"]


@dataclass(frozen=True)
class Reg:
    """A range of one register file (``v``, ``a``, ``s``, ``ttmp``), or a special register with lo =
    hi = 0."""

    file: str
    lo: int
    hi: int

    def overlaps(self, other: Reg) -> bool:
        """True when both ranges are in the same register file and share a register."""
        return self.file == other.file and self.lo <= other.hi and other.lo <= self.hi

    @property
    def count(self) -> int:
        """Number of 32-bit registers in the range."""
        return self.hi - self.lo + 1

    @property
    def is_vector(self) -> bool:
        """VGPR or AGPR."""
        return self.file in ("v", "a")

    def __str__(self) -> str:
        if self.file not in ("v", "a", "s", "ttmp"):
            return self.file
        if self.lo == self.hi:
            return f"{self.file}{self.lo}"
        return f"{self.file}[{self.lo}:{self.hi}]"


# v5, a[0:3], s[8:11], ttmp[4:7], v[5]; optional leading modifiers (-, |, neg( ...) and
# true16 halves (v0.l) are tolerated.
_REG_RE = re.compile(
    r"^[-|!~]*(?:[a-z_]+\()?(ttmp|acc|[vas])(?:(\d+)|\[(\d+)(?::(\d+))?\])(?:\.[lh])?(?!\w)",
    re.IGNORECASE,
)
_SPECIAL_REGS = frozenset(
    {"vcc", "vcc_lo", "vcc_hi", "exec", "exec_lo", "exec_hi", "m0", "scc", "null",
     "flat_scratch", "flat_scratch_lo", "flat_scratch_hi", "xnack_mask", "tba", "tma"}
)
# An unknown write (v_movreld writes v[M0 + n]): overlaps every register of its file.
_ANY = 1 << 30


def parse_register(token: str) -> tuple[Reg, ...]:
    """Registers named by one operand token; ``()`` when it names none (literal, label...)."""
    tok = token.strip()
    if not tok:
        return ()
    if tok[0] == "[" and tok[-1:] == "]":
        out: list[Reg] = []
        for part in tok[1:-1].split(","):
            out.extend(parse_register(part))
        return tuple(out)
    low = tok.lower()
    if low in _SPECIAL_REGS:
        return (Reg(low, 0, 0),)
    m = _REG_RE.match(tok)
    if m is None:
        return ()
    file = m.group(1).lower()
    if file == "acc":
        file = "a"
    if m.group(2) is not None:
        lo = hi = int(m.group(2))
    else:
        lo = int(m.group(3))
        hi = int(m.group(4)) if m.group(4) is not None else lo
    if hi < lo:  # malformed range such as v[3:0]: keep what it names, in order
        lo, hi = hi, lo
    return (Reg(file, lo, hi),)


_MODIFIER_RE = re.compile(r"^[a-z_][a-z0-9_]*:", re.IGNORECASE)
_INT_RE = re.compile(r"^[-+]?(0x[0-9a-f]+|\d+)$", re.IGNORECASE)

# Mnemonics whose VGPR/AGPR destination is not produced by the vector ALU.
_LOAD_PREFIXES = (
    "buffer_load", "tbuffer_load", "global_load", "flat_load", "scratch_load",
    "ds_read", "ds_load", "ds_bpermute", "ds_permute", "ds_swizzle", "image_load",
    "image_sample", "image_gather",
)
_PATH_ENDS = frozenset(
    {"s_endpgm", "s_endpgm_saved", "s_endpgm_ordered_ps_done", "s_setpc_b64",
     "s_swappc_b64", "s_rfe_b64", "s_call_b64"}
)


def _parse_int(text: str) -> int | None:
    t = text.strip()
    if not _INT_RE.match(t):
        return None
    try:
        return int(t, 0)
    except ValueError:  # "010": a decimal with a leading zero
        return int(t, 10)


def _split_operands(args: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not args:
        return (), ()
    if "[" not in args and "(" not in args:
        parts = args.split(",")
    else:
        parts, depth, start = [], 0, 0
        for i, ch in enumerate(args):
            if ch in "[(":
                depth += 1
            elif ch in "])":
                depth = max(0, depth - 1)
            elif ch == "," and depth == 0:
                parts.append(args[start:i])
                start = i + 1
        parts.append(args[start:])
    operands: list[str] = []
    modifiers: list[str] = []
    for part in parts:
        words = part.split()
        if not words:
            continue
        first = words[0]
        if _MODIFIER_RE.match(first):
            # ``dfmt:15, nfmt:2, s1``: a comma part that is a modifier is not an operand.
            modifiers.extend(words)
        else:
            operands.append(first)
            modifiers.extend(words[1:])
    return tuple(operands), tuple(modifiers)


class Instruction:
    """One machine instruction of the text."""

    __slots__ = ("mnemonic", "args", "line", "index", "block", "pos", "_ops", "_regs")

    def __init__(
        self, mnemonic: str, args: str, line: int, index: int, block: int = 0, pos: int = 0
    ) -> None:
        self.mnemonic = mnemonic
        self.args = args
        self.line = line
        self.index = index
        self.block = block
        self.pos = pos
        self._ops: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._regs: dict[int, tuple[Reg, ...]] | None = None

    @property
    def text(self) -> str:
        """The instruction as written, without its comment."""
        return f"{self.mnemonic} {self.args}" if self.args else self.mnemonic

    def __repr__(self) -> str:
        return f"Instruction({self.text!r}, line={self.line})"

    def _split(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if self._ops is None:
            self._ops = _split_operands(self.args)
        return self._ops

    @property
    def operands(self) -> tuple[str, ...]:
        """Operand tokens in order (registers, literals, labels)."""
        return self._split()[0]

    @property
    def modifiers(self) -> tuple[str, ...]:
        """Trailing modifiers such as ``offen``, ``offset:16``, ``sc0``, ``op_sel:[0,1]``."""
        return self._split()[1]

    def regs(self, i: int) -> tuple[Reg, ...]:
        """Registers named by operand ``i``; ``()`` when absent or not a register."""
        if self._regs is None:
            self._regs = {}
        found = self._regs.get(i)
        if found is None:
            ops = self.operands
            found = self._regs[i] = parse_register(ops[i]) if 0 <= i < len(ops) else ()
        return found

    @property
    def wait_states(self) -> int:
        """``s_nop K`` gives K+1 wait states (K is 4 bits), others 1."""
        if self.mnemonic == "s_nop":
            ops = self.operands
            k = _parse_int(ops[0]) if ops else 0
            return ((k or 0) & 0xF) + 1
        return 1

    @property
    def is_valu(self) -> bool:
        """A vector-ALU instruction (VOP1/2/3/P/C, DPP, SDWA, MFMA, v_accvgpr_*...)."""
        return self.mnemonic.startswith("v_")

    @property
    def is_load(self) -> bool:
        """Loaded data lands in VGPRs/AGPRs without the VALU."""
        return self.mnemonic.startswith(_LOAD_PREFIXES)

    def valu_vector_defs(self) -> tuple[Reg, ...]:
        """VGPR/AGPR ranges written through the vector ALU (``v_swap*`` writes two; SGPR
        destinations do not count)."""
        if not self.is_valu:
            return ()
        m = self.mnemonic
        if m.startswith(("v_movreld", "v_movrelsd")):
            return (Reg("v", 0, _ANY),)
        defs = self.regs(0)
        if "swap" in m:
            defs = defs + self.regs(1)
        if m.startswith("v_dual_") and "::" in self.args:
            # VOPD (gfx11+): ``v_dual_mov_b32 v0, v1 :: v_dual_add_f32 v2, v3, v4``.
            second = self.args.split("::", 1)[1].split(None, 1)
            if len(second) == 2:
                defs = defs + parse_register(second[1].split(",", 1)[0])
        return tuple(r for r in defs if r.is_vector)

    def vector_defs(self) -> tuple[Reg, ...]:
        """Every VGPR/AGPR range this instruction writes: VALU results and loaded data."""
        if self.is_valu:
            return self.valu_vector_defs()
        if self.is_load:
            return tuple(r for r in self.regs(0) if r.is_vector)
        return ()

    @property
    def branch_target(self) -> str | None:
        """The label of ``s_branch``/``s_cbranch_*``, else None."""
        if self.mnemonic == "s_branch" or self.mnemonic.startswith("s_cbranch_"):
            ops = self.operands
            return ops[0] if ops else None
        return None

    @property
    def ends_path(self) -> bool:
        """``s_endpgm``, ``s_setpc``, ``s_swappc``...: no successor is followed."""
        return self.mnemonic in _PATH_ENDS


@dataclass
class Block:
    """A basic block: instructions that run in sequence, entered at the top."""

    index: int
    labels: list[str] = field(default_factory=list)
    kernel: str | None = None
    line: int = 0
    instructions: list[Instruction] = field(default_factory=list)
    successors: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        """Its first branch-target-like label (``.LBB0_3``, a function), or ``line N``."""
        for label in self.labels:
            if not label.startswith((".Ltmp", ".Lfunc", ".Ldebug", ".Lcfi")):
                return label
        return f"line {self.line}"


@dataclass
class Program:
    """A parsed AMDGCN text."""

    instructions: list[Instruction]
    blocks: list[Block]
    labels: dict[str, int]
    kernels: list[str]
    target: str | None
    memory_writes: list[Instruction] = field(default_factory=list)
    """Store and atomic instructions in order, so store rules need not walk every instruction."""

    @property
    def block_of(self) -> list[int]:
        """Instruction index -> block index (also ``instructions[i].block``)."""
        return [ins.block for ins in self.instructions]

    @property
    def pos_in_block(self) -> list[int]:
        """Instruction index -> position within its block (also ``instructions[i].pos``)."""
        return [ins.pos for ins in self.instructions]

    @property
    def arch(self) -> str | None:
        """``gfxNNN`` taken from ``.amdgcn_target`` (e.g. ``amdgcn-amd-amdhsa--gfx942``)."""
        return arch_from_target(self.target)

    def kernel_of(self, ins: Instruction) -> str | None:
        """The function label the instruction belongs to."""
        return self.blocks[ins.block].kernel


_GFX_RE = re.compile(r"gfx[0-9a-z]+", re.IGNORECASE)


def arch_from_target(target: str | None) -> str | None:
    """The ``gfxNNN`` name inside a target triple/id, or None."""
    if not target:
        return None
    found = _GFX_RE.findall(target.split(":", 1)[0]) or _GFX_RE.findall(target)
    return found[-1].lower() if found else None


# The first token of a line that is not a directive (``.loc 1 2``; a ``.L0:`` label is kept),
# whether a colon follows it (a label), and the rest of the line. The match begins at the
# newline before the line.
_LINE_RE = re.compile(r"\n[ \t]*(?!\.[\w.$]*[ \t\r\n])([^\s;:,\"'#\[\]/]+)(:?)([^\n]*)")
_MNEMONIC_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*$")
_TARGET_RE = re.compile(r"\n[ \t]*\.amdgcn_target[ \t]+\"?([^\"\n]*)")
# Directives that switch sections: only code sections are parsed (debug sections are
# half of a Triton .amdgcn file, and YAML metadata lines look like labels).
_SECTION_RE = re.compile(
    r"\n[ \t]*\.(text|data|bss|section|pushsection|popsection|previous|amdgpu_metadata"
    r"|end_amdgpu_metadata)(?![\w.])([^\n]*)"
)


def _code_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of ``text`` that hold code (everything before any section switch)."""
    spans: list[tuple[int, int]] = []
    in_code, start, before_metadata = True, 0, True
    for m in _SECTION_RE.finditer(text):
        kind = m.group(1)
        if kind == "amdgpu_metadata":
            before_metadata, code = in_code, False
        elif kind == "end_amdgpu_metadata":
            code = before_metadata
        elif kind in ("section", "pushsection"):
            name = m.group(2).strip().lstrip('"')
            code = name.startswith(".text") or not name
        else:  # .text; .previous/.popsection cannot be followed cheaply: parse them
            code = kind != "data" and kind != "bss"
        if code and not in_code:
            start = m.end()
        elif in_code and not code:
            spans.append((start, m.start()))
        in_code = code
    if in_code:
        spans.append((start, len(text)))
    return spans


def _link(blocks: list[Block], labels: dict[str, int]) -> None:
    n = len(blocks)
    for b in blocks:
        last = b.instructions[-1] if b.instructions else None
        nxt = b.index + 1 if b.index + 1 < n else None
        succ: list[int] = []
        if last is None or not (last.mnemonic.startswith("s_") and _ends_block(last.mnemonic)):
            if nxt is not None:
                succ.append(nxt)
        elif last.mnemonic in _PATH_ENDS:
            pass
        else:  # s_branch: its target; s_cbranch_*: its target and the fallthrough
            t = labels.get(last.branch_target or "")
            if t is not None:
                succ.append(t)
            if last.mnemonic != "s_branch" and nxt is not None and nxt not in succ:
                succ.append(nxt)
        b.successors = succ


def _operand_text(rest: str) -> str:
    for marker in (";", "//"):
        cut = rest.find(marker)
        if cut >= 0:
            rest = rest[:cut]
    return rest.strip()


def _ends_block(mnemonic: str) -> bool:
    return mnemonic == "s_branch" or mnemonic.startswith("s_cbranch_") or mnemonic in _PATH_ENDS


def parse(text: str | bytes) -> Program:
    """Parse AMDGCN assembly text into instructions and basic blocks. Never raises."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        text = str(text)
    text = "\n" + text  # every line, the first included, now follows a newline
    found = _TARGET_RE.search(text)
    target = (found.group(1).strip() or None) if found else None

    instructions: list[Instruction] = []
    blocks: list[Block] = [Block(index=0, line=1)]
    labels: dict[str, int] = {}
    kernels: list[str] = []
    memory_writes: list[Instruction] = []
    kernel: str | None = None
    cur = blocks[0]
    cur_instrs = cur.instructions
    close_block = False  # the previous instruction was a branch or a path end
    line, pos = 0, 0
    count = text.count
    is_mnemonic = _MNEMONIC_RE.match
    for lo, hi in _code_spans(text):
        for m in _LINE_RE.finditer(text, lo, hi):
            start = m.start() + 1
            line += count("\n", pos, start)
            pos = start
            tok, colon, rest = m.groups()
            while colon:  # a label, perhaps followed by more on the same line
                if not tok.startswith("."):
                    kernel = tok
                    kernels.append(tok)
                if cur_instrs or close_block:
                    cur = Block(index=len(blocks), kernel=kernel, line=line)
                    cur_instrs = cur.instructions
                    blocks.append(cur)
                    close_block = False
                elif not cur.labels:
                    cur.line = line
                cur.kernel = kernel
                cur.labels.append(tok)
                labels.setdefault(tok, cur.index)
                more = _LINE_RE.match("\n" + rest) if rest.strip() else None
                if more is None:
                    tok = ""
                    break
                tok, colon, rest = more.groups()
            if not tok or not is_mnemonic(tok):
                continue  # junk, or YAML-like text: not an instruction
            if close_block:
                cur = Block(index=len(blocks), kernel=kernel, line=line)
                cur_instrs = cur.instructions
                blocks.append(cur)
                close_block = False
            mnemonic = tok.lower()
            ins = Instruction(
                mnemonic, _operand_text(rest), line, len(instructions), cur.index,
                len(cur_instrs),
            )
            if not cur_instrs and not cur.labels:
                cur.line = line
            instructions.append(ins)
            cur_instrs.append(ins)
            if mnemonic[:2] == "s_":
                if _ends_block(mnemonic):
                    close_block = True
            elif "store" in mnemonic or "atomic" in mnemonic:
                memory_writes.append(ins)
    _link(blocks, labels)
    return Program(instructions, blocks, labels, kernels, target, memory_writes)


# Every label of a code line (group 1), and whether more than a comment follows it on
# that line (group 2). The lookahead takes the whole token at once: no backtracking.
_LABEL_RE = re.compile(r"\n[ \t]*(?=([^\s;:,\"'#\[\]/]+))\1:([ \t]*[^\s;/])?")


class TextView:
    """Reads instructions from AMDGCN text on demand, so a rule need not parse a whole cache file;
    where :attr:`simple` is False, parse instead."""

    def __init__(self, text: str | bytes) -> None:
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8", errors="replace")
        elif not isinstance(text, str):
            text = str(text)
        self.text = "\n" + text
        self.spans = _code_spans(self.text)
        found = _TARGET_RE.search(self.text)
        self.target = (found.group(1).strip() or None) if found else None
        self._labels: dict[str, int] = {}
        self._functions: list[tuple[int, str]] = []
        self._simple = True
        self._scan_labels()
        self._lower: str | None = None

    def _scan_labels(self) -> None:
        labels, functions = self._labels, self._functions
        for lo, hi in self.spans:
            for m in _LABEL_RE.finditer(self.text, lo, hi):
                name, more = m.groups()
                if more:
                    self._simple = False
                    return
                labels.setdefault(name, m.start())
                if not name.startswith("."):
                    functions.append((m.start(), name))

    @property
    def simple(self) -> bool:
        """True when this view reads the text exactly as :func:`parse` does."""
        return self._simple

    @property
    def arch(self) -> str | None:
        """``gfxNNN`` from ``.amdgcn_target``."""
        return arch_from_target(self.target)

    def lines_containing(self, needles: tuple[str, ...]) -> list[int]:
        """Sorted offsets of code lines containing any lower-case ``needle``; needs :attr:`simple`.
        """
        if self._lower is None:
            text = self.text
            if not text.isascii():  # lower() may change lengths; '?' per character does not
                text = text.encode("ascii", "replace").decode("ascii")
            self._lower = text.lower()
        low, text = self._lower, self.text
        found: set[int] = set()
        for lo, hi in self.spans:
            for needle in needles:
                i = low.find(needle, lo, hi)
                while i >= 0:
                    found.add(text.rfind("\n", lo, i + 1))
                    i = low.find(needle, i + 1, hi)
        return sorted(found)

    def instruction_at(self, offset: int) -> tuple[Instruction | None, int]:
        """The instruction at ``offset`` (None for a label or junk), next line's offset."""
        m = _LINE_RE.match(self.text, offset)
        if m is None:
            nxt = self.text.find("\n", offset + 1)
            return None, (len(self.text) if nxt < 0 else nxt)
        return self._instruction(m), m.end()

    def walk(self, offset: int) -> Iterator[tuple[Instruction, int]]:
        """Instructions in text order from ``offset`` on, each with the next line's offset."""
        text = self.text
        for lo, hi in self.spans:
            if hi <= offset:
                continue
            for m in _LINE_RE.finditer(text, max(lo, offset), hi):
                ins = self._instruction(m)
                if ins is not None:
                    yield ins, m.end()

    @staticmethod
    def _instruction(m: re.Match[str]) -> Instruction | None:
        tok, colon, rest = m.groups()
        if colon or not _MNEMONIC_RE.match(tok):
            return None
        return Instruction(tok.lower(), _operand_text(rest), 0, -1)

    def label_offset(self, name: str) -> int | None:
        """Needs :attr:`simple`."""
        return self._labels.get(name)

    def function_labels(self) -> list[tuple[int, str]]:
        """(offset, name) of every kernel label (not starting with ``.``). Needs :attr:`simple`."""
        return self._functions

    def line_numbers(self, offsets: list[int]) -> list[int]:
        """1-based line numbers of the lines at ``offsets`` (sorted ascending)."""
        lines, pos, line = [], 0, 0
        for off in offsets:
            line += self.text.count("\n", pos, off + 1)
            pos = off + 1
            lines.append(line)
        return lines
