"""What each aiter release does with DeepSeek MLA attention: the one per-aiter-version table.

Every fact here was read from aiter's own sources, ``aiter/ops/mha.py`` (the Python dispatch
gates) and ``hsa/<gfx>/fmha_v3_{fwd,bwd}/`` (the ASM kernel tables), at the tag or commit
named in each row. The C++ side launches the ASM kernel of the device's *real* arch
(``get_gpu_arch()`` reads ``gcnArchName``, ``csrc/include/aiter_hip_common.h``), while the
Python gates ask ``get_gfx()``, which answers the last entry of ``GPU_ARCHS``
(``aiter/jit/utils/chip_info.py``). When the two disagree, a gate can choose an ASM kernel the
device does not have; the run then stops with ``invalid argument for fmha_fwd`` (0.1.7's
``csrc/py_itfs_cu/asm_mha_fwd.cu``) or ``... for fmha_v3_bwd``.

Facts that do not change between the releases read (so they are not columns):

- the dense forward takes an fmha_v3 kernel only for ``seqlen_q > 128`` (CK below);
- the dense backward takes fmha_v3 only for ``seqlen_q > 16``, and on gfx942 only when
  ``hdim_q == hdim_v`` (``can_impl_fmha_v3_bwd``): q/k 192, v 128 goes to CK ``mha_bwd`` there
  unless ``get_gfx()`` answers gfx950;
- the varlen backward (``_flash_attn_varlen_backward``) needs ``hdim_q == hdim_v`` on gfx942 and
  gfx950 alike: q/k 192, v 128 always goes to CK ``mha_varlen_bwd``;
- gfx942's fmha_v3 backward table has q/k 192 only with v 192 (``bwd_hd192_*_psskddv``), gfx950's
  also has q/k 192, v 128 (``bwd_hd192_hd128_*`` in 0.1.7, ``bwd_hd192_128_*`` on main), in batch
  mode only. That per-arch fact is ``aiter_fmha_v3_bwd_qk192_v128`` in :mod:`titan_rocm.archs`.

Sources: PyPI ``amd-aiter`` 0.1.7.post2.dev18 (its ``aiter/ops/mha.py``, ``chip_info.py`` and
``torch_guard.py`` equal tag v0.1.7.post2, commit 169acef, 2025-11-14); ROCm/aiter tags v0.1.8
(9402062), v0.1.11 (c4a3ff2), v0.1.16 (0730b33) and main at e4048607 (2026-08-22).
"""

from __future__ import annotations

from dataclasses import dataclass

from titan_rocm.platform import parse_version


@dataclass(frozen=True)
class AiterRelease:
    """The MLA-relevant facts of aiter from version :attr:`since` up to the next row."""

    name: str
    """The versions the row covers, e.g. ``0.1.8-0.1.10`` or ``0.1.16+`` (main included)."""
    since: tuple[int, int, int]
    read_at: str
    """Where these facts were read (tag and commit)."""
    fwd_v3_qk192_gate: frozenset[str] | None
    """``get_gfx()`` answers for which the forward gates (``_flash_attn_forward`` and
    ``_flash_attn_varlen_forward``, ``can_impl_fmha_v3_fwd``) send q/k 192, v 128 bf16 to an
    fmha_v3 ASM forward; None: any answer (the gate has no arch check)."""
    fwd_v3_qk192_kernels: frozenset[str]
    """Real archs whose fmha_v3 forward table has q/k 192, v 128 kernels (batch and group)."""
    bwd_v3_qk192_v128_causal_on_gfx950: bool
    """gfx950's backward gate takes q/k 192, v 128 with a causal mask too (False: only
    without a mask, ``nmask``)."""


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
)
"""Rows in version order; a version belongs to the last row whose ``since`` it reaches."""


def release_for(version: str | None) -> AiterRelease | None:
    """The table row for an installed aiter ``version``; None when unknown."""
    parsed = parse_version(version) if version else None
    if parsed is None:
        return None
    row = RELEASES[0]
    for candidate in RELEASES:
        if parsed >= candidate.since:
            row = candidate
    return row
