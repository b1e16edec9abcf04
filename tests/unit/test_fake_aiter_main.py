"""The fake aiter of the newest aiter main (tests/fake_aiter/main) against the one of e4048607
(tests/fake_aiter/e4048607): they differ where ROCm/aiter#4875 changed aiter/ops/mha.py, the
FlyDSL backward for q/k 192, v 128 causal varlen self-attention that
``_flash_attn_varlen_backward`` takes on gfx942 before both fmha_v3 gates (the PR head
90efdcb4, ``can_impl_fmha_bwd_flydsl``); everything else is the same module."""

from __future__ import annotations

import importlib
import itertools
import sys

import pytest
import torch

from tests.support.mla_test_support import FAKE_AITER, assert_matches, reference

pytestmark = pytest.mark.usefixtures("clean_mla_state")

SEGMENTS = (0, 40, 96)


@pytest.fixture(params=["main", "e4048607"])
def fake(request, monkeypatch):
    """One of the two main-line fakes imported, on a gfx942 device; its control module."""
    monkeypatch.syspath_prepend(str(FAKE_AITER))
    monkeypatch.syspath_prepend(str(FAKE_AITER / request.param))
    importlib.invalidate_caches()
    control = importlib.import_module("aiter._fake")
    importlib.import_module("aiter.ops.mha")
    control.reset("gfx942")
    return control


def _backward(*, qk=192, heads_kv=2, causal=True, same_cu=True, dtype=torch.bfloat16,
              deterministic=False):
    """aiter's own varlen forward then backward of two packed documents: the kernel the
    backward reached, and dq, dk, dv against fp32 attention of each document."""
    mha = sys.modules["aiter.ops.mha"]
    fake = sys.modules["aiter._fake"]
    gen = torch.Generator().manual_seed(0)
    total = SEGMENTS[-1]
    q = torch.randn(total, 2, qk, generator=gen).to(dtype)
    k = torch.randn(total, heads_kv, qk, generator=gen).to(dtype)
    v = torch.randn(total, heads_kv, 128, generator=gen).to(dtype)
    cu = torch.tensor(SEGMENTS, dtype=torch.int32)
    cu_k = cu if same_cu else cu.clone()
    longest = max(b - a for a, b in itertools.pairwise(SEGMENTS))
    out, lse, _, rng = mha._flash_attn_varlen_forward(
        q, k, v, cu, cu_k, None, None, longest, longest, 0, 0.0, 0.1, causal, return_lse=True)
    fake.CALLS.clear()
    dout = torch.randn(out.shape, generator=gen).to(dtype)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    mha._flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, cu, cu_k, longest,
                                    longest, 0.0, 0.1, causal, -1, -1, None, deterministic, rng)
    return fake.names()[-1], (q, k, v, dout), (dq, dk, dv)


def test_4875_routes_mla_varlen_backward_to_flydsl_on_main_only(fake):
    reached, (q, k, v, dout), grads = _backward()
    assert reached == {"main": "flydsl_flash_attn_varlen_bwd",
                       "e4048607": "mha_varlen_bwd"}[fake.CHOICE]
    for start, end in itertools.pairwise(SEGMENTS):
        piece = [t[None, start:end] for t in (q, k, v, dout)]
        _, *want = reference(*piece[:3], 0.1, piece[3])
        for got, expected in zip(grads, want, strict=True):
            assert_matches(got[start:end], expected[0])


@pytest.mark.parametrize(("change", "why"), [
    ({"causal": False}, "no mask"),
    ({"same_cu": False}, "k's cu_seqlens another tensor, even with equal values"),
    ({"heads_kv": 1}, "GQA"),
    ({"qk": 128}, "q/k 128: fmha_v3's own gate"),
])
def test_4875_gate_refuses_what_aiter_refuses(fake, change, why):
    reached, _, _ = _backward(**change)
    assert reached == ("fmha_v3_varlen_bwd" if change.get("qk") == 128 else "mha_varlen_bwd"), why


@pytest.mark.parametrize("fake", ["main"], indirect=True)
def test_4875_gate_reads_get_gfx_flydsl_and_not_deterministic(fake, monkeypatch):
    assert _backward(deterministic=True)[0] == "flydsl_flash_attn_varlen_bwd"
    monkeypatch.setattr(sys.modules["fake_aiter_support"], "FLYDSL_AVAILABLE", False)
    assert _backward()[0] == "mha_varlen_bwd"
    monkeypatch.setattr(sys.modules["fake_aiter_support"], "FLYDSL_AVAILABLE", True)
    monkeypatch.setenv("GPU_ARCHS", "gfx950")
    sys.modules["aiter.jit.utils.chip_info"].get_gfx.cache_clear()
    assert _backward()[0] == "mha_varlen_bwd"
    # get_gfx() told gfx942 on a gfx950 device: the gate passes on aiter's word alone.
    monkeypatch.setenv("GPU_ARCHS", "gfx942")
    sys.modules["aiter.jit.utils.chip_info"].get_gfx.cache_clear()
    fake.reset("gfx950")
    with pytest.raises(NotImplementedError, match="FlyDSL gfx942 varlen backward on a gfx950"):
        _backward()


def test_the_two_fakes_share_every_module_but_their_identity(fake):
    aiter = sys.modules["aiter"]
    mha = sys.modules["aiter.ops.mha"]
    assert mha.__file__.endswith("fake_aiter/main/aiter/ops/mha.py")
    assert aiter._fake.GENERATION == "main"  # aiter's API generation, both
    assert aiter.__version__ == {"main": "0.1.21.dev0",
                                 "e4048607": "0.1.21.dev46+ge4048607a5"}[fake.CHOICE]
