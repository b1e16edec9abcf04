"""What each aiter release does with DeepSeek MLA attention: the one per-aiter-version table.

Each row was read from aiter's ``aiter/ops/mha.py`` and ``hsa/<gfx>/fmha_v3_{fwd,bwd}/`` at the tag
or commit it names. The C++ side launches the kernel of the *real* arch while the Python gates ask
``get_gfx()`` (the last entry of ``GPU_ARCHS``); where they disagree a gate can pick a kernel the
device lacks. The facts common to every release, the markers and the sources are in
docs/mla-ck-backward.md."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from titan_rocm.platform import SIMULATED_AITERS, PlatformFacts, parse_version

FLYDSL_VARLEN_BACKWARD = "#4875"
"""ROCm/aiter#4875, the FlyDSL q/k 192, v 128 varlen backward: the name of its marker."""


@dataclass(frozen=True)
class Marker:
    """Text an aiter change added to one of aiter's files: an aiter holding it has the change."""

    change: str
    """The change, e.g. ``#4875`` (ROCm/aiter pull request)."""
    path: str
    """The file, relative to the aiter package directory."""
    text: str

    def held_by(self, root: Path) -> bool:
        """The aiter package in directory ``root`` holds the text."""
        try:
            return self.text in (root / self.path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False


@dataclass(frozen=True)
class AiterRelease:
    """The MLA-relevant facts of aiter from version :attr:`since` up to the next row."""

    name: str
    """The versions the row covers, e.g. ``0.1.8-0.1.10``, ``0.1.16+`` (main up to e4048607) or
    ``main with #4875``."""
    since: tuple[int, int, int]
    read_at: str
    """Where these facts were read (tag and commit)."""
    fwd_v3_qk192_gate: frozenset[str] | None
    """``get_gfx()`` answers for which the forward gates send q/k 192, v 128 bf16 to an fmha_v3 ASM
    forward; None: any answer (the gate has no arch check)."""
    fwd_v3_qk192_kernels: frozenset[str]
    """Real archs whose fmha_v3 forward table has q/k 192, v 128 kernels (batch and group)."""
    bwd_v3_qk192_v128_causal_on_gfx950: bool
    """gfx950's backward gate takes q/k 192, v 128 with a causal mask too (False: only
    without a mask, ``nmask``)."""
    varlen_bwd_flydsl_gate: frozenset[str] = frozenset()
    """``get_gfx()`` answers for which ``_flash_attn_varlen_backward`` sends q/k 192, v 128 bf16
    causal self-attention to its FlyDSL kernel before both fmha_v3 gates (ROCm/aiter#4875; its
    conditions: docs/mla-ck-backward.md)."""
    varlen_bwd_flydsl_kernels: frozenset[str] = frozenset()
    """Real archs that FlyDSL kernel is written and validated for."""
    marker: Marker | None = None
    """What the row's change added to aiter's files; None: the version alone places an aiter
    in the row."""

    def holds_marker(self, markers: frozenset[str]) -> bool:
        """This row can apply to an aiter whose files hold ``markers`` (change names)."""
        return self.marker is None or self.marker.change in markers


RELEASES: tuple[AiterRelease, ...] = (
    AiterRelease(
        name="0.1.7",
        since=(0, 0, 0),
        read_at="v0.1.7.post2 (169acef) = PyPI amd-aiter 0.1.7.post2.dev18",
        fwd_v3_qk192_gate=frozenset({"gfx950"}),
        fwd_v3_qk192_kernels=frozenset({"gfx950"}),
        bwd_v3_qk192_v128_causal_on_gfx950=False,
    ),
    AiterRelease(
        name="0.1.8-0.1.10",
        since=(0, 1, 8),
        read_at="v0.1.8 (9402062)",
        fwd_v3_qk192_gate=None,
        fwd_v3_qk192_kernels=frozenset({"gfx942", "gfx950"}),
        bwd_v3_qk192_v128_causal_on_gfx950=False,
    ),
    AiterRelease(
        name="0.1.11-0.1.15",
        since=(0, 1, 11),
        read_at="v0.1.11 (c4a3ff2)",
        fwd_v3_qk192_gate=None,
        fwd_v3_qk192_kernels=frozenset({"gfx942", "gfx950"}),
        bwd_v3_qk192_v128_causal_on_gfx950=True,
    ),
    AiterRelease(
        name="0.1.16+",
        since=(0, 1, 16),
        read_at="v0.1.16 (0730b33) through main e4048607 (2026-08-22)",
        fwd_v3_qk192_gate=frozenset({"gfx942", "gfx950"}),
        fwd_v3_qk192_kernels=frozenset({"gfx942", "gfx950"}),
        bwd_v3_qk192_v128_causal_on_gfx950=True,
    ),
    AiterRelease(
        # e4048607 reports 0.1.21.dev46 and #4875 was merged after it: an aiter with the
        # marker is at least 0.1.21.dev.
        name=f"main with {FLYDSL_VARLEN_BACKWARD}",
        since=(0, 1, 21),
        read_at="ROCm/aiter #4875 at its PR head 90efdcb4 (merged after e4048607), "
        "aiter/ops/mha.py _flash_attn_varlen_backward's can_impl_fmha_bwd_flydsl",
        fwd_v3_qk192_gate=frozenset({"gfx942", "gfx950"}),
        fwd_v3_qk192_kernels=frozenset({"gfx942", "gfx950"}),
        bwd_v3_qk192_v128_causal_on_gfx950=True,
        varlen_bwd_flydsl_gate=frozenset({"gfx942"}),
        # aiter/ops/flydsl/kernels/fmha_bwd_gfx942/, and op_tests/test_mha_flydsl_varlen_bwd.py
        # runs only where get_gfx() is gfx942 (SUPPORTED_GFX).
        varlen_bwd_flydsl_kernels=frozenset({"gfx942"}),
        marker=Marker(FLYDSL_VARLEN_BACKWARD, "ops/mha.py", "can_impl_fmha_bwd_flydsl"),
    ),
)
"""Rows in version order; a version belongs to the last row whose ``since`` it reaches and
whose marker (if it has one) its files hold."""

SIMULATED_MARKERS: dict[str, frozenset[str]] = {
    "0.1.7": frozenset(),
    "e4048607": frozenset(),
    "main": frozenset({FLYDSL_VARLEN_BACKWARD}),
}
"""``--aiter`` choice (:data:`titan_rocm.platform.SIMULATED_AITERS`) -> the markers its aiter
holds: the newest main read has #4875; e4048607 and PyPI 0.1.7 predate it."""

MARKERS: tuple[Marker, ...] = tuple(row.marker for row in RELEASES if row.marker is not None)
"""Every marker a row needs, in row order."""


def marker_names() -> tuple[str, ...]:
    """The changes the markers name (what ``AttentionCall.aiter_markers`` accepts)."""
    return tuple(marker.change for marker in MARKERS)


def release_for(version: str | None,
                markers: frozenset[str] = frozenset()) -> AiterRelease | None:
    """The table row for aiter ``version`` whose files hold ``markers``; None for an unknown
    version."""
    parsed = parse_version(version) if version else None
    if parsed is None:
        return None
    row = RELEASES[0]
    for candidate in RELEASES:
        if parsed >= candidate.since and candidate.holds_marker(markers):
            row = candidate
    return row


@functools.lru_cache(maxsize=8)
def markers_in(root: Path) -> frozenset[str]:
    """The markers the aiter package at ``root`` holds (cached: its files do not change in a run).
    """
    return frozenset(marker.change for marker in MARKERS if marker.held_by(root))


def _aiter_package_dir() -> Path | None:
    """The importable ``aiter`` package's directory, found without importing it."""
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def installed_markers(facts: PlatformFacts) -> frozenset[str]:
    """The markers of the aiter ``facts`` describe (a simulated one's from
    :data:`SIMULATED_MARKERS`, an installed one's from its files); empty without aiter."""
    aiter = facts.aiter
    if aiter is None:
        return frozenset()
    if facts.simulated:
        for choice, simulated in SIMULATED_AITERS.items():
            if simulated.version == aiter.version:
                return SIMULATED_MARKERS[choice]
        return frozenset()
    root = _aiter_package_dir()
    return markers_in(root) if root is not None else frozenset()
