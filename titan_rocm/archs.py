"""Per-gfx facts, in one place, so "what does titan-rocm do on gfx942" has one answer; each
fact's sources are in the docs page of the workaround that reads it."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ArchFacts:
    """Facts about one AMD GPU architecture (a ``gfxNNN`` target)."""

    name: str
    products: tuple[str, ...]
    wave_size: int
    store_hazard_windows: bool
    """The gfx940 family's VMEM store data hazard windows (llvm-project #197267), which the
    ``precise`` rule encodes; elsewhere the scan uses the ``conservative`` rule."""
    aiter_fmha_v3_bwd_qk192_v128: bool
    """aiter's fmha_v3 ASM backward takes q/k 192 with v 128 (DeepSeek MLA); else CK must."""
    aiter_fmha_v3_bwd_qk128_v128: bool
    """aiter's fmha_v3 ASM backward takes q/k = v 128 here (PyPI 0.1.7.post2 and main e4048607), so
    titan-rocm leaves that shape to aiter (Primus routes it to CK on gfx942)."""
    opus_splitk_solidx_ranges: tuple[tuple[int, int], ...]
    """Half-open ``solidx`` ranges of aiter's split-K opus GEMMs whose workspace is a per-stream
    hipMalloc registry, unsafe under graph capture (docs/gemm-tables.md)."""
    cu_nums: tuple[int, ...]
    """Identify this arch in aiter tables without a ``gfx`` column."""


ARCHS: dict[str, ArchFacts] = {
    facts.name: facts
    for facts in (
        ArchFacts(
            name="gfx90a",
            products=("MI210", "MI250", "MI250X"),
            wave_size=64,
            store_hazard_windows=False,
            aiter_fmha_v3_bwd_qk192_v128=False,
            aiter_fmha_v3_bwd_qk128_v128=False,
            opus_splitk_solidx_ranges=(),
            cu_nums=(104, 110),
        ),
        ArchFacts(
            name="gfx942",
            products=("MI300X", "MI300A", "MI308X", "MI325X"),
            wave_size=64,
            store_hazard_windows=True,
            aiter_fmha_v3_bwd_qk192_v128=False,
            aiter_fmha_v3_bwd_qk128_v128=True,
            opus_splitk_solidx_ranges=((10200, 10300),),
            cu_nums=(304, 228, 80, 20, 38),
        ),
        ArchFacts(
            name="gfx950",
            products=("MI350X", "MI355X"),
            wave_size=64,
            store_hazard_windows=True,
            aiter_fmha_v3_bwd_qk192_v128=True,
            aiter_fmha_v3_bwd_qk128_v128=True,
            opus_splitk_solidx_ranges=((200, 300), (1200, 1300)),
            cu_nums=(256, 32),
        ),
        ArchFacts(
            name="gfx1250",
            products=("MI450",),
            wave_size=32,
            store_hazard_windows=False,
            aiter_fmha_v3_bwd_qk192_v128=False,
            aiter_fmha_v3_bwd_qk128_v128=False,
            # gfx1250's split-K opus kernels (solidx [20000, 21000)) allocate their
            # workspace with a capture-aware torch.empty: none of them is unsafe.
            opus_splitk_solidx_ranges=(),
            cu_nums=(256, 96),
        ),
    )
}


def normalize_arch(name: str) -> str:
    """The bare target of a ``gcnArchName`` such as ``gfx942:sramecc+:xnack-``."""
    return name.strip().split(":", 1)[0].lower()


def arch_facts(name: str) -> ArchFacts:
    """Facts for ``name``; ValueError naming the architectures titan-rocm knows."""
    key = normalize_arch(name)
    try:
        return ARCHS[key]
    except KeyError:
        known = ", ".join(sorted(ARCHS))
        raise ValueError(f"unknown AMD GPU architecture {name!r}; known: {known}") from None


# -- ISA-family facts: they hold for every target of a family, listed in ARCHS or not (a
# scanned kernel may be for any AMDGCN target, so these take the name, not ArchFacts).

_GFX10_AND_LATER = re.compile(r"gfx1\d\d")


def stores_counted_by_vmcnt(arch: str | None) -> bool:
    """Whether ``s_waitcnt vmcnt`` also waits for stores (None: taken as GFX9); GFX10 and later
    count stores apart (``s_waitcnt_vscnt``, ``s_wait_storecnt``)."""
    return not (arch and _GFX10_AND_LATER.match(arch))


def gfx9_waitcnt_vmcnt(imm: int) -> int:
    """Bits 3:0 low, 15:14 high (llvm-project ``llvm/test/MC/AMDGPU/sopp-gfx9.s`` at c1898945:
    ``vmcnt(62)`` is 0xcf7e)."""
    return (imm & 0xF) | ((imm >> 14) & 0x3) << 4
