"""The fake aiters (PyPI 0.1.7, main at e4048607, the newest main with #4875) against
titan-rocm's per-release table: what each fake's own dispatch (its gates copied from that
aiter's aiter/ops/mha.py) does with q/k 192, v 128 is what the routing predicts, for every real
arch x get_gfx() answer x layout x mask; and the same for the backward of q/k 128, v 128, which
titan-rocm leaves to aiter's fmha_v3 kernel.

This ties the hand-written facts in aiter_releases.py and archs.py to the fakes' gates and
kernel tables; the fakes' docstrings cite where those were read.
"""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

from tests.support.mla_test_support import FAKE_AITER, GENERATIONS, cpu_facts
from titan_rocm.platform import SIMULATED_AITERS, AiterFacts, PlatformFacts
from titan_rocm.workarounds.mla_ck_backward.aiter_releases import (
    SIMULATED_MARKERS,
    installed_markers,
    markers_in,
)
from titan_rocm.workarounds.mla_ck_backward.routing import (
    AITER,
    AttentionCall,
    route_backward,
    route_forward,
)

pytestmark = pytest.mark.usefixtures("clean_mla_state")

SEQLEN = 160  # above the dense forward's 128 and the backward's 16


def _inputs(varlen: bool, qk: int = 192):
    gen = torch.Generator().manual_seed(0)
    shape = (SEQLEN,) if varlen else (1, SEQLEN)
    q, k = (torch.randn(*shape, 2, qk, generator=gen).to(torch.bfloat16) for _ in range(2))
    v = torch.randn(*shape, 2, 128, generator=gen).to(torch.bfloat16)
    return q, k, v


def _run_aiters_own(mha, direction: str, varlen: bool, causal: bool, qk: int = 192) -> str:
    """The kernel aiter's own dispatch reaches (its name, or ``failed: <message>``)."""
    fake = sys.modules["aiter._fake"]
    q, k, v = _inputs(varlen, qk)
    cu = torch.tensor([0, 100, SEQLEN], dtype=torch.int32)
    if varlen:
        out, lse, _, rng = mha._flash_attn_varlen_forward(
            q, k, v, cu, cu, None, None, 100, 100, 0, 0.0, 0.1, causal, return_lse=True)
    elif fake.GENERATION == "0.1.7":
        out, lse, _, rng = mha._flash_attn_forward(q, k, v, 0.0, 0.1, causal, -1, -1, None,
                                                   None, True, False)
    else:
        out, lse, _, rng = mha._flash_attn_forward(q, k, v, 0.0, 0.1, causal, -1, -1, 0, None,
                                                   None, None, None, None, True, False)
    if direction == "forward":
        return fake.names()[-1]
    fake.CALLS.clear()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dout = torch.ones_like(out)
    if varlen:
        mha._flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, cu, cu, 100, 100,
                                        0.0, 0.1, causal, -1, -1, None, False, rng)
    else:
        mha._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, None, 0.0, 0.1, causal,
                                 -1, -1, None, None, False, rng)
    return fake.names()[-1]


def _aiter(fake) -> dict[str, object]:
    """The routing's view of the aiter a fake stands for: its version and markers."""
    return {"aiter_version": SIMULATED_AITERS[fake.CHOICE].version,
            "aiter_markers": SIMULATED_MARKERS[fake.CHOICE]}


def _kernel_name(route_kernel: str) -> str:
    """``fmha_v3_fwd (ASM) for seqlen_q > 128, else CK mha_fwd`` -> ``fmha_v3_fwd`` (at this
    seqlen); ``CK mha_bwd (...)`` -> ``mha_bwd``."""
    first = route_kernel.removeprefix("CK ").split(" ")[0]
    return first


def test_fake_gates_do_what_the_release_table_predicts(fake_aiter, monkeypatch):
    mha = sys.modules["aiter.ops.mha"]
    chip_info = sys.modules["aiter.jit.utils.chip_info"]
    checked = 0
    flydsl = 0
    for arch, aiter_gfx, varlen, causal, direction in itertools.product(
        ("gfx942", "gfx950"), ("gfx942", "gfx950"), (False, True), (True, False),
        ("forward", "backward"),
    ):
        case = (fake_aiter.CHOICE, arch, aiter_gfx, "varlen" if varlen else "dense",
                "causal" if causal else "no mask", direction)
        monkeypatch.setenv("GPU_ARCHS", aiter_gfx)
        chip_info.get_gfx.cache_clear()  # a new process, as far as aiter's cache goes
        fake_aiter.reset(arch)
        call = AttentionCall(arch, 192, 192, 128, layout="thd" if varlen else "bshd",
                             causal=causal, aiter_gfx=aiter_gfx, **_aiter(fake_aiter))
        route = route_forward(call) if direction == "forward" else route_backward(call)
        try:
            reached = _run_aiters_own(mha, direction, varlen, causal)
        except RuntimeError as exc:
            reached = f"failed: {exc}"
        if route.backend == AITER:
            assert reached == _kernel_name(route.kernel), (case, route, reached)
        elif direction == "forward":
            assert reached.startswith("failed: invalid argument"), (case, route, reached)
        else:  # CK backward: aiter reaches the same CK kernel, or fails where titan-rocm routes
            assert reached in (route.function, ) or reached.startswith("failed"), (case, reached)
        checked += 1
        flydsl += reached == "flydsl_flash_attn_varlen_bwd"
    assert checked == 32
    # #4875's kernel: reached only on the newest main, where the route leaves the call to it.
    assert flydsl == (1 if fake_aiter.CHOICE == "main" else 0)


def test_fake_gates_run_fmha_v3_for_qk128_v128_backward_where_the_route_says(fake_aiter,
                                                                              monkeypatch):
    """q/k 128, v 128 backward: each generation's own dispatch reaches the kernel the route
    names (fmha_v3 on gfx942 and gfx950, told either arch), never a failed fmha_v3 call."""
    mha = sys.modules["aiter.ops.mha"]
    chip_info = sys.modules["aiter.jit.utils.chip_info"]
    reached_v3 = 0
    for arch, aiter_gfx, varlen, causal in itertools.product(
        ("gfx942", "gfx950"), ("gfx942", "gfx950"), (False, True), (True, False),
    ):
        monkeypatch.setenv("GPU_ARCHS", aiter_gfx)
        chip_info.get_gfx.cache_clear()
        fake_aiter.reset(arch)
        call = AttentionCall(arch, 128, 128, 128, layout="thd" if varlen else "bshd",
                             causal=causal, aiter_gfx=aiter_gfx, **_aiter(fake_aiter))
        route = route_backward(call)
        reached = _run_aiters_own(mha, "backward", varlen, causal, qk=128)
        assert route.backend == AITER
        if arch == "gfx942":
            assert route.kernel.startswith("fmha_v3"), route
        if route.kernel != "aiter's choice":
            assert reached == _kernel_name(route.kernel), (arch, aiter_gfx, varlen, route)
        reached_v3 += reached.startswith("fmha_v3")
    assert reached_v3 == 16


def test_each_fakes_files_hold_the_markers_of_the_aiter_it_stands_for(fake_aiter_path):
    """#4875's marker (``can_impl_fmha_bwd_flydsl`` in aiter/ops/mha.py) is read from the
    installed aiter's own files, without importing it: the newest main's fake holds it, the
    e4048607 one (its package has no ops/ of its own) and PyPI 0.1.7's do not; a machine's
    facts (not simulated) take them from there, a simulated aiter from its --aiter choice."""
    root = FAKE_AITER / GENERATIONS[fake_aiter_path] / "aiter"
    assert markers_in(root) == SIMULATED_MARKERS[fake_aiter_path]
    machine = cpu_facts(hip_version="6.4", device_count=1, gcn_arch_name="gfx942",
                        aiter_spec_found=True,
                        aiter=AiterFacts(SIMULATED_AITERS[fake_aiter_path].version, "gfx942",
                                         "test"))
    assert "aiter" not in sys.modules
    assert installed_markers(machine) == SIMULATED_MARKERS[fake_aiter_path]
    assert "aiter" not in sys.modules  # read, not imported
    simulated = PlatformFacts.simulated_rocm("gfx942", aiter=fake_aiter_path)
    assert installed_markers(simulated) == SIMULATED_MARKERS[fake_aiter_path]


def test_no_aiter_has_no_markers(tmp_path):
    assert installed_markers(PlatformFacts.simulated_rocm("gfx942", aiter="absent")) == set()
    assert markers_in(tmp_path) == set()  # an aiter without ops/mha.py: nothing to read


def test_every_aiter_choice_names_its_markers():
    """plan --aiter and gemm-tables --aiter share the choices; each says which markers it has."""
    assert list(SIMULATED_MARKERS) == list(SIMULATED_AITERS) == list(GENERATIONS)
