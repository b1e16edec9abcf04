"""The capture hazards of aiter's tuned BF16 GEMM kernels as named rules, and which hold
(docs/gemm-tables.md, "The rules").

Read from the job's aiter sources (a marker of the fix, not a version string) or ``--aiter``; with
no aiter known every rule holds."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from titan_rocm.archs import ArchFacts
from titan_rocm.gemm_tables.policy import judge, parse_integer
from titan_rocm.platform import AITER_CHOICES, SIMULATED_AITERS
from titan_rocm.serial import json_form


@dataclass(frozen=True)
class Marker:
    """Text that one of aiter's Python files holds, e.g. the line a fix added."""

    path: str
    text: str

    def found_in(self, root: Path) -> Path | None:
        """The first file under ``root`` matching :attr:`path` that holds :attr:`text`."""
        for candidate in sorted(root.glob(self.path)):
            try:
                if self.text in candidate.read_text(encoding="utf-8", errors="replace"):
                    return candidate
            except OSError:
                continue
        return None

    def describe(self) -> str:
        """``'text' in aiter/path`` for a message."""
        return f"{self.text!r} in aiter/{self.path}"


Match = Callable[[Mapping[str, str], "ArchFacts | None", str], "str | None"]
"""(row fields, arch facts or None, policy) → why the rule removes the row, or None."""


@dataclass(frozen=True)
class CaptureRule:
    """One reason a tuned row is unsafe under graph capture, with its evidence."""

    name: str
    libtype: str
    rows: str
    failure: str
    source: str
    """Repo, file, commit."""
    ended_by: str
    hazard: Marker
    """Code the defect lives in; an aiter with neither it nor :attr:`fix` keeps the rule."""
    fix: Marker
    """Found, the rule does not hold."""
    matches: Match

    def to_dict(self) -> dict[str, str]:
        """JSON-able form (without the matcher)."""
        return json_form(self, "name libtype rows failure source ended_by fix_marker",
                         fix_marker=self.fix.describe())


def _asm_splitk(fields: Mapping[str, str], facts: ArchFacts | None, policy: str) -> str | None:
    if fields["libtype"].strip().lower() != "asm":
        return None
    text = fields.get("splitK")
    if text is None or not text.strip():
        # aiter then passes splitK=None, which takes the semaphore path (gemm_a16w16_asm).
        return "asm kernel without a splitK value (aiter picks its own split-K)"
    split = parse_integer(text, "splitK")
    return f"asm split-K kernel (splitK {split})" if split > 1 else None


def _opus_splitk(fields: Mapping[str, str], facts: ArchFacts | None, policy: str) -> str | None:
    if fields["libtype"].strip().lower() != "opus" or facts is None:
        return None
    verdict = judge(fields, facts, policy)
    return verdict.reason if verdict.unsafe else None


_FLYDSL_SPLIT = re.compile(r"_split_k(?P<split>\d+)_")


def _flydsl_splitk(fields: Mapping[str, str], facts: ArchFacts | None, policy: str) -> str | None:
    if fields["libtype"].strip().lower() != "flydsl":
        return None
    # aiter reads the kernel's split from its name (gemm_kernels._HGEMM_KERNEL_RE); a name
    # it cannot parse is not dispatched (tuned_gemm falls back to the next candidate).
    name = fields["kernelName"].strip()
    found = _FLYDSL_SPLIT.search(name)
    if found is None or int(found["split"]) <= 1:
        return None
    family = "small_m" if "_small_m" in name else "hgemm"
    return f"FlyDSL {family} split-K kernel (split_k {found['split']})"


AITER_MAIN = "ROCm/aiter main e4048607 (2026-08-22)"

RULES: tuple[CaptureRule, ...] = (
    CaptureRule(
        name="asm-splitk-semaphore",
        libtype="asm",
        rows="libtype asm with splitK > 1 (or no splitK: aiter then picks a split itself)",
        failure="the split-K counter is zeroed once per stream, outside the graph; a replay "
        "that finds it non-zero never reduces and every wave spins: the GPU hangs",
        source="aiter/ops/gemm_op_a16w16.py get_semaphore_workspace (per-stream lru_cache of "
        "one torch.zeros), csrc/py_itfs_cu/asm_gemm_a16w16.cu (semaphore passed when "
        f"split > 1), {AITER_MAIN}; ROCm/aiter#4494, #4920",
        ended_by="ROCm/aiter#4916 (merged after 2026-08-24; re-lands #4494 c6ce60c7, which "
        "#4709 518cfbc6 reverted): a per-launch counter zeroed inside the graph",
        hazard=Marker("ops/gemm_op_a16w16.py", "get_semaphore_workspace"),
        fix=Marker("ops/gemm_op_a16w16.py", "is_current_stream_capturing"),
        matches=_asm_splitk,
    ),
    CaptureRule(
        name="opus-splitk-workspace",
        libtype="opus",
        rows="libtype opus on gfx942/gfx950 whose solidx is a split-K kernel id "
        "(titan_rocm.archs opus_splitk_solidx_ranges; --policy all-opus: every opus row)",
        failure="the fp32 partial-sum workspace lives in a per-stream hipMalloc registry; a "
        "capture that is the first to touch it on its stream aborts the process "
        "(opus_gemm.cu: 'splitk workspace not initialized for the current CUDA stream')",
        source="aiter/ops/opus/gemm_op_a16w16.py _SPLITK_KID_RANGES and "
        f"opus_gemm_workspace_init, aiter/tuned_gemm.py (its NOTE on gfx942/gfx950), {AITER_MAIN}",
        ended_by="ROCm/aiter#4961 ('use Torch workspaces', merged after 2026-08-22): every "
        "launch gets its workspace from torch.empty, which graph capture allocates from the "
        "graph's pool",
        hazard=Marker("ops/opus/*.py", "opus_gemm_workspace_init"),
        fix=Marker("ops/opus/**/*.py", "opus_gemm_a16w16_launch"),
        matches=_opus_splitk,
    ),
    CaptureRule(
        name="flydsl-splitk-counter",
        libtype="flydsl",
        rows="libtype flydsl whose kernelName has split_k > 1 (hgemm and small_m families)",
        failure="the split-K counter and signal are zeroed once per stream (a first call "
        "inside a capture allocates them from the graph's pool); left dirty, small_m has no "
        "block to raise the signal and hgemm's early reset strands the blocks still waiting: "
        "the GPU hangs, or (a signal left raised) blocks add to an output not yet zeroed",
        source="aiter/ops/flydsl/gemm_kernels.py _get_split_k_tensors (lru_cache per "
        "stream), kernels/small_m_hgemm.py prepare_split_k_tile and split_k_barrier, "
        f"kernels/splitk_hgemm.py zero_c and split_k_barrier, {AITER_MAIN}; ROCm/aiter#4715",
        ended_by="ROCm/aiter#4715 (open at 2026-08-22): a capture-time workspace whose "
        "zero-fill is recorded in the graph (_get_split_k_tensors_cached)",
        hazard=Marker("ops/flydsl/gemm_kernels.py", "_get_split_k_tensors"),
        fix=Marker("ops/flydsl/gemm_kernels.py", "_get_split_k_tensors_cached"),
        matches=_flydsl_splitk,
    ),
)

RULE_NAMES: tuple[str, ...] = tuple(rule.name for rule in RULES)


@dataclass(frozen=True)
class RuleState:
    """Whether one rule holds for the aiter in question, and why (one sentence)."""

    rule: CaptureRule
    holds: bool
    why: str

    def to_dict(self) -> dict[str, object]:
        return {**self.rule.to_dict(), "holds": self.holds, "why": self.why}


@dataclass(frozen=True)
class AiterRules:
    """The rules in force and how the aiter they describe was known."""

    known_as: str
    """``installed at PATH``, ``--aiter NAME: ...``, or ``unknown`` (every rule holds)."""
    states: tuple[RuleState, ...]

    def holding(self) -> list[CaptureRule]:
        """The rules that hold, in :data:`RULES` order."""
        return [s.rule for s in self.states if s.holds]

    def to_dict(self) -> dict[str, object]:
        return {"known_as": self.known_as, "rules": [s.to_dict() for s in self.states]}


SIMULATED: dict[str, dict[str, tuple[bool, str]]] = {
    "0.1.7": {
        "asm-splitk-semaphore": (
            False,
            "aiter 0.1.7 (v0.1.7.post2, 169acef) has no semaphore: a split-K launch zeroes "
            "its output first (out.zero_() in csrc/py_itfs_cu/asm_gemm_a16w16.cu), a step a "
            "graph records",
        ),
        "opus-splitk-workspace": (
            False,
            "aiter 0.1.7 (169acef) dispatches no opus kernel (tuned_gemm.py solMap: torch, "
            "hipblaslt, skinny, asm)",
        ),
        "flydsl-splitk-counter": (
            False,
            "aiter 0.1.7 (169acef) dispatches no FlyDSL kernel (tuned_gemm.py solMap)",
        ),
    },
    "e4048607": {
        "asm-splitk-semaphore": (
            True,
            f"{AITER_MAIN}: #4494 was reverted (#4709) and #4916 is not in it",
        ),
        "opus-splitk-workspace": (True, f"{AITER_MAIN}: #4961 is not in it"),
        "flydsl-splitk-counter": (True, f"{AITER_MAIN}: #4715 is not in it"),
    },
    "main": {
        "asm-splitk-semaphore": (
            False,
            "aiter main has ROCm/aiter#4916 (merged): under capture get_semaphore_workspace "
            "hands each launch its own slot of a pool allocated before capture and zeroes it "
            "inside the graph (is_current_stream_capturing, _get_captured_semaphore_workspace "
            "in aiter/ops/gemm_op_a16w16.py; PR head 0e8c750d)",
        ),
        "opus-splitk-workspace": (
            False,
            "aiter main has ROCm/aiter#4961 (merged): every split-K kid gets a torch.empty "
            "workspace per launch (_execute_a16w16 in aiter/ops/opus/gemm/gemm_op_a16w16.py at "
            "534a0fc2; _build_a16w16_workspace_spec in aiter/ops/opus/launch_plan.py at "
            "1f24221f), which a capture allocates from the graph's pool",
        ),
        "flydsl-splitk-counter": (
            True,
            "aiter main: ROCm/aiter#4715 is still open; _get_split_k_tensors "
            "(aiter/ops/flydsl/gemm_kernels.py) still zeroes its counter once per stream",
        ),
    },
}
"""``--aiter`` choice → rule → (holds, why), read from aiter's sources at the commits named."""


def unknown_aiter(reason: str) -> AiterRules:
    """Every rule holds: nothing tells which aiter will read the tables."""
    return AiterRules(
        known_as="unknown",
        states=tuple(RuleState(rule, True, f"{reason}: every rule applies") for rule in RULES),
    )


def simulated(choice: str) -> AiterRules:
    """The rules of ``--aiter choice``; raises ValueError naming those accepted."""
    if choice not in AITER_CHOICES:
        raise ValueError(f"--aiter {choice!r} is not valid; accepted: {', '.join(AITER_CHOICES)}")
    if choice == "absent":
        return unknown_aiter("--aiter absent: no aiter to read")
    facts = SIMULATED[choice]
    return AiterRules(
        known_as=f"--aiter {choice}: {SIMULATED_AITERS[choice].read_at}",
        states=tuple(RuleState(rule, *facts[rule.name]) for rule in RULES),
    )


def detect(root: Path, rules: Sequence[CaptureRule] = RULES) -> AiterRules:
    """The rules that hold for the aiter at ``root``; an aiter this table does not know keeps them.
    """
    states = []
    for rule in rules:
        fixed = rule.fix.found_in(root)
        if fixed is not None:
            states.append(RuleState(rule, False, f"fixed here: {rule.fix.text!r} in {fixed}"))
            continue
        hazard = rule.hazard.found_in(root)
        if hazard is not None:
            states.append(RuleState(
                rule, True, f"{hazard} has {rule.hazard.text!r} and not the fix "
                f"({rule.fix.describe()})"))
        else:
            states.append(RuleState(
                rule, True, f"neither {rule.hazard.describe()} nor the fix "
                f"({rule.fix.describe()}) is in {root}: applied, to be safe"))
    return AiterRules(known_as=f"installed at {root}", states=tuple(states))


def installed_aiter_root() -> Path | None:
    """Found without importing aiter (it raises at import without ROCm)."""
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return Path(locations[0])
    return Path(spec.origin).parent if spec.origin else None


def rules_for(aiter: str | None) -> AiterRules:
    """The rules in force: of ``--aiter``, else the installed aiter's, else all; ValueError for an
    unknown ``aiter``."""
    if aiter is not None:
        return simulated(aiter)
    root = installed_aiter_root()
    if root is None:
        return unknown_aiter("no aiter is installed here and --aiter was not given")
    return detect(root)
