"""Tuned BF16 GEMM tables of our own making, shaped like aiter's, for
tests/unit/gemm_tables/test_gemm_tables.py.

Every row is generated from a *kind* (architecture, ``libtype``, and for opus kernels whether
its ``solidx`` is a split-K one) with made-up shapes, timings and kernel names, so a test knows
which rows the rule must remove without asking the code under test. aiter's own tables are
not copied; what is carried from them are facts: the columns, the kinds of rows, and how
many rows of each kind aiter's tables held (:data:`AITER_COMPOSITION`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

HEADER = (
    "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,"
    "kernelName,err_ratio,tflops,bw"
)
BATCHED_HEADER = "gfx,cu_num,B,M,N,K,dtype,outdtype,kernelId,splitK,us,kernelName,tflops,bw"
"""A table of another kind (aiter's batched GEMMs): no libtype, no solidx."""

CU_NUM = {"gfx942": 80, "gfx950": 256, "gfx1250": 96}

# solidx ranges (half-open) of each kind: split-K opus ids where the hazard lives, other
# opus ids (capture-safe kernels) around them, and gfx1250's opus ids (all named splitk,
# all safe: its workspace comes from a capture-aware allocation).
_SOLIDX = {
    ("gfx942", "splitk"): [(10200, 10300)],
    ("gfx942", "other"): [(10000, 10200), (10300, 10400)],
    ("gfx950", "splitk"): [(200, 300), (1200, 1300)],
    ("gfx950", "other"): [(1, 200), (300, 1200), (1300, 1400)],
    ("gfx1250", "safe-arch"): [(20001, 20565)],
}
_OPUS_NAMES = {
    ("gfx942", "splitk"): "opus_gemm_gfx942_splitk_t{tile}",
    ("gfx942", "other"): "opus_gemm_gfx942_{variant}_t{tile}",
    ("gfx950", "splitk"): "opus_gemm_flatmm_splitk_t{tile}",
    ("gfx950", "other"): "opus_gemm_flatmm_{variant}_t{tile}",
    ("gfx1250", "safe-arch"): "opus_gemm_gfx1250_splitk_t{tile}",
}
_VARIANTS = {"gfx942": ("wkc", "p1", "tile"), "gfx950": ("tile", "mono_tile", "persistent")}
_OTHER_NAMES = {"asm": "_ZN5aiter{n}asm_gemmE", "torch": "native", "triton": "auto",
                "skinny": "skinny_gemm_{n}",
                "flydsl": "flydsl_gemm2_abf16_wbf16_bf16_t64x64x128_split_k1_block_m_warp2_{n}"}
# Split-K kernels of the other libraries: asm (splitK > 1 in the table), FlyDSL's two families
# (the split is in the name; both families share the capture hazard).
_SPLITK_NAMES = {
    ("asm", "splitk"): "_ZN5aiter{n}asm_gemm_splitk_cleanE",
    ("flydsl", "splitk"): "flydsl_gemm2_abf16_wbf16_bf16_t64x64x128_split_k{split}_block_m_warp2_"
                          "block_n_warp2_block_k_warp1_async_copyTrue_b_to_ldsTrue_"
                          "b_preshuffleFalse_c_to_ldsFalse_{arch}",
    ("flydsl", "small_m"): "flydsl_gemm2_abf16_wbf16_bf16_t16x64x256_split_k{split}_block_m_warp1_"
                           "block_n_warp4_block_k_warp1_async_copyTrue_b_to_ldsTrue_"
                           "b_preshuffleFalse_c_to_ldsFalse_small_m_nr2_{arch}",
}

Kind = tuple[str, str, str]
"""(arch, libtype, class): class is ``splitk`` / ``other`` for opus rows of gfx942/gfx950,
``safe-arch`` for gfx1250's opus rows; for asm and flydsl ``splitk`` (a split-K kernel:
asm splitK > 1, FlyDSL hgemm split_k > 1) and, for flydsl only, ``small_m`` (a split-K
small_m kernel); ``-`` for the rest."""

AITER_COMPOSITION: dict[Kind, int] = {
    ("gfx942", "opus", "splitk"): 79,
    ("gfx942", "opus", "other"): 104,
    ("gfx942", "asm", "splitk"): 14,
    ("gfx942", "torch", "-"): 19,
    ("gfx942", "triton", "-"): 2,
    ("gfx942", "skinny", "-"): 2,
    ("gfx942", "flydsl", "splitk"): 2,
    ("gfx950", "opus", "splitk"): 27,
    ("gfx950", "opus", "other"): 49,
    ("gfx950", "asm", "splitk"): 202,
    ("gfx950", "asm", "-"): 312,
    ("gfx950", "flydsl", "splitk"): 604,
    ("gfx950", "flydsl", "-"): 379,
    ("gfx950", "torch", "-"): 429,
    ("gfx950", "triton", "-"): 185,
    ("gfx950", "skinny", "-"): 15,
    ("gfx1250", "opus", "safe-arch"): 127,
    ("gfx1250", "triton", "-"): 783,
    ("gfx1250", "torch", "-"): 4,
}
"""Rows of each kind in aiter's BF16 tuned-GEMM tables (ROCm/aiter ``aiter/configs`` and
``configs/model_configs``, main of 2026-08-22; 17 tables, 3,338 rows). 36 of gfx942's 79
split-K opus rows carry ``splitK = 0`` (the kernel picks its own split). Every FlyDSL row is
of the hgemm family (no small_m kernel)."""
AITER_SPLITK_ZERO = {"gfx942": 36}


@dataclass(frozen=True)
class Row:
    """One generated row and what the rule must decide about it."""

    line: int
    """1-based line in the file (the header is line 1)."""
    arch: str
    libtype: str
    kind: str
    text: str

    @property
    def unsafe(self) -> bool:
        """An opus row removed under ``--policy splitk-opus``."""
        return self.libtype == "opus" and self.kind == "splitk"

    @property
    def opus_of_unsafe_arch(self) -> bool:
        """An opus row removed under ``--policy all-opus``."""
        return self.libtype == "opus" and self.kind in ("splitk", "other")

    def rule(self) -> str | None:
        """The capture rule that removes the row when every rule holds (splitk-opus)."""
        if self.unsafe:
            return "opus-splitk-workspace"
        if (self.libtype, self.kind) == ("asm", "splitk"):
            return "asm-splitk-semaphore"
        if self.libtype == "flydsl" and self.kind in ("splitk", "small_m"):
            return "flydsl-splitk-counter"
        return None


def _row(rng: random.Random, kind: Kind, splitk_zero: bool, n: int) -> str:
    arch, libtype, cls = kind
    m, nn, k = rng.choice([1, 16, 64, 256, 4096]), rng.choice([512, 2048, 7168]), \
        rng.choice([1536, 4096, 7168])
    if libtype == "opus":
        low, high = rng.choice(_SOLIDX[(arch, cls)])
        solidx = rng.randrange(low, high)
        name = _OPUS_NAMES[(arch, cls)].format(
            tile=rng.randrange(1, 64), variant=rng.choice(_VARIANTS.get(arch, ("tile",))))
        split = "0" if splitk_zero or cls != "splitk" else str(rng.choice([2, 4, 8]))
    elif (libtype, cls) in _SPLITK_NAMES:
        solidx = rng.randrange(0, 64)
        split = str(rng.randrange(2, 16))
        name = _SPLITK_NAMES[(libtype, cls)].format(n=n, split=split, arch=arch)
    else:
        solidx = rng.randrange(0, 64) if libtype in ("asm", "flydsl", "skinny") else 0
        name = _OTHER_NAMES[libtype].format(n=n)
        split = rng.choice(["0", "1"]) if libtype == "asm" else "0"
    us = round(rng.uniform(2, 400), 2)
    return (f"{arch},{CU_NUM[arch]},{m},{nn},{k},False,torch.bfloat16,torch.bfloat16,False,"
            f"False,{libtype},{solidx},{split},{us},{name},0.0,{round(rng.uniform(1, 900), 2)},"
            f"{round(rng.uniform(10, 5000), 2)}")


def make_table(path: Path, composition: dict[Kind, int], *, seed: int = 0,
               splitk_zero: dict[str, int] | None = None) -> list[Row]:
    """Write a table holding ``composition`` rows of each kind, in a seeded random order.

    Args:
        splitk_zero: per arch, how many of its split-K opus rows carry ``splitK = 0``.

    Returns:
        the rows, in file order, with what the rule must decide about each.
    """
    rng = random.Random(seed)
    kinds = [kind for kind, count in composition.items() for _ in range(count)]
    rng.shuffle(kinds)
    zero_left = dict(splitk_zero or {})
    rows: list[Row] = []
    lines = [HEADER]
    for n, kind in enumerate(kinds):
        zero = kind[2] == "splitk" and zero_left.get(kind[0], 0) > 0
        if zero:
            zero_left[kind[0]] -= 1
        text = _row(rng, kind, zero, n)
        lines.append(text)
        rows.append(Row(len(lines), kind[0], kind[1], kind[2], text))
    path.write_text("\n".join(lines) + "\n")
    return rows


def make_batched_table(path: Path) -> None:
    """A table of another kind (no libtype/solidx columns), for the 'missing columns' error."""
    rows = [f"gfx950,256,{b},128,512,1024,torch.bfloat16,torch.bfloat16,{i},0,9.5,bmm_{i},"
            "30.1,400.2" for i, b in enumerate((1, 2, 4, 8))]
    path.write_text("\n".join([BATCHED_HEADER, *rows]) + "\n")


def split_composition(composition: dict[Kind, int], parts: int) -> list[dict[Kind, int]]:
    """``composition`` dealt into ``parts`` tables (each kind spread as evenly as it goes)."""
    out: list[dict[Kind, int]] = [{} for _ in range(parts)]
    for kind, count in composition.items():
        for i in range(parts):
            share = count // parts + (1 if i < count % parts else 0)
            if share:
                out[i][kind] = share
    return out
