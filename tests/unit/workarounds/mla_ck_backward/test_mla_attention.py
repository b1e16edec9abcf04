"""rocm.mla_ck_backward on CPU: dense custom ops, module, guard, aiter_api and converter, against
the fake aiter in both generations (PyPI 0.1.7.post2 and main).

The real aiter needs ROCm; the fixtures in ``mla_test_support`` put one fake generation on
``sys.path`` (each test that takes ``fake_aiter`` runs once per generation) and simulate the ROCm
arch with ``platform.override``. The fakes define aiter's kernels and ``_flash_attn_backward`` as
``torch.ops.aiter`` ops behind ``(*args, **kwargs)`` wrappers, as the real aiter does, so
titan-rocm reads their parameters from the op schemas; they record which kernel each call
reached and compute it with an fp32 reference attention. Varlen (document masks): see
test_mla_varlen.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import logging
import sys
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.support.mla_test_support import assert_matches, cpu_facts, on_rocm, qkv, reference
from tests.support.moe_test_models import (
    build_meta,
    convert,
    decisions,
    model_args,
    parse,
    world_of_one,
)
from titan_rocm import platform
from titan_rocm.adapters.tt022.converters.context import job_context
from titan_rocm.platform import PlatformFacts
from titan_rocm.settings import RocmSettings
from titan_rocm.workarounds.base import Context, Parallelism, planning
from titan_rocm.workarounds.mla_ck_backward import aiter_api, guard, op
from titan_rocm.workarounds.mla_ck_backward.module import (
    MLAFlexInnerAttention,
    MLAInnerAttention,
    MLAVarlenInnerAttention,
)
from titan_rocm.workarounds.mla_ck_backward.seams_tt022 import (
    DEEPSEEK_PARALLELIZE,
    expected_attention_dtype,
)
from titan_rocm.workarounds.mla_ck_backward.workaround import MLACKBackward

pytestmark = pytest.mark.usefixtures("clean_mla_state")

INNER = "attention.inner_attention"
CONVERTER = ("--model.converters", "rocm.mla_ck_backward")


def _aiter_backward(mha, q, k, v):
    """aiter's own flash_attn_func, as Primus-Turbo calls it (non-deterministic backward)."""
    out = mha.flash_attn_func(
        q, k, v, softmax_scale=0.1, causal=True, deterministic=False, return_lse=True
    )[0]
    out.backward(torch.ones_like(out))


def _assert_aiter_backward_grads(q, k, v):
    """q's and v's gradients from :func:`_aiter_backward` are the reference attention's."""
    _, dq, _, dv = reference(q, k, v, 0.1, torch.ones(*q.shape[:3], v.shape[-1]))
    assert_matches(q.grad, dq)
    assert_matches(v.grad, dv)


# -- the custom ops ------------------------------------------------------------------------


# What each generation's own dispatch runs for the causal bf16 MLA backward (seqlen_q > 16).
GFX950_BACKWARD = {"0.1.7": "mha_bwd", "main": "fmha_v3_bwd"}  # 0.1.7: gfx950 gate needs nmask


@pytest.mark.parametrize("arch", ["gfx942", "gfx90a", "gfx950"])
def test_gradients_through_the_op_match_reference_attention(fake_aiter, arch):
    q, k, v = qkv()
    with on_rocm(arch, fake_aiter):
        out = op.mla_flash_attention(q, k, v, softmax_scale=0.1, causal=True)
        dout = torch.randn_like(out)
        out.backward(dout)
    ref_out, dq, dk, dv = reference(q, k, v, 0.1, dout)
    assert_matches(out, ref_out)
    assert_matches(q.grad, dq)
    assert_matches(k.grad, dk)
    assert_matches(v.grad, dv)
    backward = GFX950_BACKWARD[fake_aiter.GENERATION] if arch == "gfx950" else "mha_bwd"
    assert fake_aiter.names() == ["mha_fwd", backward]
    details = fake_aiter.CALLS[-1][1]
    assert details["v_shape"][-1] == 128 and details["dout_shape"][-1] == 128  # never padded
    assert details["q_shape"][-1] == 192 and details["causal"] is True


# gfx942, seqlen_q > 128: PyPI 0.1.7 has no q/k 192 fmha_v3 forward there (CK); main has one.
LONG_FORWARD = {"0.1.7": "mha_fwd", "main": "fmha_v3_fwd"}


def test_long_sequences_take_the_forward_aiter_has_for_the_release(fake_aiter):
    q, k, v = qkv(batch=1, seqlen=160, heads=2)
    with on_rocm("gfx942", fake_aiter):
        op.mla_flash_attention(q, k, v, softmax_scale=0.1).sum().backward()
    assert fake_aiter.names() == [LONG_FORWARD[fake_aiter.GENERATION], "mha_bwd"]


# aiter alone, GPU_ARCHS="gfx942;gfx950" on an MI300X, causal q/k 192, v 128, seqlen 160:
# 0.1.7 sends the forward to fmha_v3_fwd (no gfx942 kernel: "invalid argument for fmha_fwd");
# main's forward has gfx942 kernels but its gfx950 backward gate sends the backward to
# fmha_v3_bwd, which gfx942 lacks.
ALONE_FAILS = {"0.1.7": "invalid argument for fmha_fwd",
               "main": "invalid argument for fmha_v3_bwd"}
ROUTED = {"0.1.7": ["mha_fwd", "mha_bwd"], "main": ["fmha_v3_fwd", "mha_bwd"]}


def test_misdetected_arch_routes_both_directions_by_the_device(fake_aiter, monkeypatch):
    monkeypatch.setenv("GPU_ARCHS", "gfx942;gfx950")
    mha = sys.modules["aiter.ops.mha"]
    generation = fake_aiter.GENERATION
    with on_rocm("gfx942", fake_aiter) as facts:
        assert facts.aiter.gfx == "gfx950" and facts.aiter.mismatch("gfx942")
        with pytest.raises(RuntimeError, match=ALONE_FAILS[generation]):
            _aiter_backward(mha, *qkv(batch=1, seqlen=160, heads=2))  # aiter alone
        fake_aiter.reset("gfx942")
        q, k, v = qkv(batch=1, seqlen=160, heads=2)
        out = op.mla_flash_attention(q, k, v, softmax_scale=0.1)
        dout = torch.randn_like(out)
        out.backward(dout)
    assert fake_aiter.names() == ROUTED[generation]
    _, dq, dk, dv = reference(q, k, v, 0.1, dout)
    assert_matches(q.grad, dq)
    assert_matches(v.grad, dv)


def test_route_logged_once_per_shape_and_direction(fake_aiter, caplog):
    with on_rocm("gfx942", fake_aiter), caplog.at_level(logging.INFO, logger="titan_rocm"):
        for _ in range(2):
            q, k, v = qkv()
            op.mla_flash_attention(q, k, v, softmax_scale=0.1).sum().backward()
        q, k, v = qkv(qk=128)
        op.mla_flash_attention(q, k, v, softmax_scale=0.1).sum().backward()
    lines = [r.getMessage() for r in caplog.records if "mla_ck_backward [op]" in r.getMessage()]
    assert len(lines) == 4, lines
    assert ("gfx942 q/k 192, v 128, bfloat16: backward -> ck (mha_bwd), runs CK mha_bwd"
            in lines[1])
    assert "q/k 192, v 128, bfloat16: forward -> aiter (_flash_attn_forward)" in lines[0]
    assert "q/k 128, v 128, bfloat16: backward -> aiter (_flash_attn_backward)" in lines[3]


def test_opcheck_schema_fake_and_autograd_registration(fake_aiter):
    q, k, v = qkv(batch=1, seqlen=24, heads=2)
    with on_rocm("gfx942", fake_aiter):
        torch.library.opcheck(op.FORWARD_OP, (q, k, v, 0.0, 0.1, True, False))
        with torch.no_grad():
            out, lse, rng = op.FORWARD_OP(q, k, v, 0.0, 0.1, True, False)
        dout = torch.randn_like(out)
        q, k, v = (t.detach() for t in (q, k, v))  # no double backward
        torch.library.opcheck(
            op.BACKWARD_OP, (dout, q, k, v, out, lse, rng, 0.0, 0.1, True, False)
        )


def test_torch_compile_fullgraph_matches_eager(fake_aiter):
    module = MLAInnerAttention()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    grads = []
    with on_rocm("gfx942", fake_aiter):
        for fn in (module, compiled):
            q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in qkv(seed=1))
            out = fn(q, k, v, scale=0.1)
            out.backward(torch.ones_like(out))
            grads.append((out.detach(), q.grad, k.grad, v.grad))
    for eager, comp in zip(*grads, strict=True):
        torch.testing.assert_close(comp, eager)
    assert fake_aiter.names().count("mha_bwd") == 2  # compiled backward routed too


@pytest.mark.parametrize(("save", "forward_calls"), [(True, 1), (False, 2)])
def test_op_sac_saves_the_forward_instead_of_recomputing(fake_aiter, save, forward_calls):
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import _apply_op_sac

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner_attention = MLAInnerAttention()

        def forward(self, q, k, v):
            return self.inner_attention(q * 1.0, k, v, scale=0.1)

    save_list = {op.FORWARD_OP} if save else set()
    block = _apply_op_sac(Block(), ActivationCheckpoint(), op_sac_save_list=save_list)
    q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in qkv())
    with on_rocm("gfx942", fake_aiter):
        block(q, k, v).sum().backward()
    assert fake_aiter.names().count("mha_fwd") == forward_calls
    assert fake_aiter.names().count("mha_bwd") == 1


# -- the module ----------------------------------------------------------------------------


def test_deepseek_attention_with_the_module_matches_sdpa(fake_aiter):
    """TorchTitan's real DeepSeek V3 Attention (debug args), bf16: swapped vs stock."""
    import copy

    from torchtitan.models.deepseek_v3 import deepseekv3_args
    from torchtitan.models.deepseek_v3.model.model import Attention, precompute_freqs_cis

    args = copy.deepcopy(deepseekv3_args["debugmodel"])
    torch.manual_seed(0)
    stock = Attention(args)
    with torch.no_grad():
        stock.init_weights(0.02)
    stock = stock.to(torch.bfloat16)
    swapped = copy.deepcopy(stock)
    swapped.inner_attention = MLAInnerAttention(stock.inner_attention.sdpa_backends)
    freqs_cis = precompute_freqs_cis(args)
    x = torch.randn(2, 32, args.dim, dtype=torch.bfloat16)
    outs = []
    with on_rocm("gfx942", fake_aiter):
        for model in (stock, swapped):
            y = model(x, freqs_cis, None)
            y.float().square().sum().backward()
            outs.append((y.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (y_stock, g_stock), (y_swapped, g_swapped) = outs
    assert_matches(y_swapped, y_stock)
    for name, grad in g_stock.items():
        rel = (g_swapped[name].float() - grad.float()).norm() / grad.float().norm()
        assert rel < 3e-2, (name, float(rel))
    assert fake_aiter.names() == ["mha_fwd", "mha_bwd"]


def test_inputs_aiter_cannot_take_fall_back_to_sdpa_and_log_once(fake_aiter, caplog):
    module = MLAInnerAttention()
    q, k, v = (t.transpose(1, 2) for t in qkv(dtype=torch.float32))
    with on_rocm("gfx942", fake_aiter), caplog.at_level(logging.WARNING, logger="titan_rocm"):
        out = module(q, k, v, scale=0.1)
        module(q, k, v, scale=0.1)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.1,
                                                                   is_causal=True))
    warnings = [r.getMessage() for r in caplog.records if "runs PyTorch SDPA" in r.getMessage()]
    assert len(warnings) == 1 and "torch.float32" in warnings[0]
    assert fake_aiter.names() == []


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(MLAInnerAttention, "ScaledDotProductAttentionWrapper"),
     (MLAFlexInnerAttention, "FlexAttentionWrapper"),
     (MLAVarlenInnerAttention, "FlexAttentionWrapper")],
)
def test_module_call_signature_matches_the_replaced_wrapper(ours, theirs):
    from torchtitan.models import attention

    mine = inspect.signature(ours.forward)
    stock = inspect.signature(getattr(attention, theirs).forward)
    assert list(mine.parameters) == list(stock.parameters)
    for name, param in stock.parameters.items():
        assert mine.parameters[name].kind == param.kind
        assert mine.parameters[name].default == param.default


def test_flex_replacement_runs_causal_attention_and_refuses_score_mod(fake_aiter):
    from torch.nn.attention.flex_attention import create_block_mask

    mask = create_block_mask(lambda b, h, q, kv: q >= kv, 1, None, 32, 32, device="cpu")
    module = MLAFlexInnerAttention()
    q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in qkv())
    with on_rocm("gfx942", fake_aiter):
        out = module(q, k, v, block_mask=mask, scale=0.1)
        out.backward(torch.ones_like(out))
        with pytest.raises(NotImplementedError, match="score_mod"):
            module(q, k, v, block_mask=mask, score_mod=lambda s, *_: s)
    ref, dq, _, dv = reference(*(t.transpose(1, 2) for t in (q, k, v)), 0.1,
                                torch.ones(2, 32, 4, 128))
    assert_matches(out.transpose(1, 2), ref)
    assert_matches(q.grad.transpose(1, 2), dq)
    assert_matches(v.grad.transpose(1, 2), dv)
    assert fake_aiter.names() == ["mha_fwd", "mha_bwd"]


# -- the guard -----------------------------------------------------------------------------


def test_guard_patches_aiter_when_it_is_first_imported(fake_aiter_path):
    assert guard.install() == "deferred until aiter.ops.mha loads"
    assert guard.hook_pending() and "aiter" not in sys.modules
    import aiter.ops.mha as mha

    assert guard.is_guarded(mha._flash_attn_backward)
    assert not guard.hook_pending()
    original = getattr(mha._flash_attn_backward, guard.ORIGINAL_ATTR)
    assert mha._flash_attn_backward.__name__ == original.__name__
    assert inspect.signature(mha._flash_attn_backward) == inspect.signature(original)


def test_guard_patches_a_loaded_aiter_once_and_unpatches(fake_aiter):
    mha = sys.modules["aiter.ops.mha"]
    original = mha._flash_attn_backward
    assert guard.install() == "patched"
    assert guard.install() == "already patched"
    guard.uninstall()
    assert mha._flash_attn_backward is original


def test_guard_leaves_padded_v_to_aiter_whose_gfx942_kernels_take_it(fake_aiter):
    """q/k 192, v 192 on gfx942: both releases pick fmha_v3_bwd's bwd_hd192_*_psskddv
    kernels, which gfx942 has; the guard does not route it (issue 14, finding 3)."""
    mha = sys.modules["aiter.ops.mha"]
    guard.install()
    with on_rocm("gfx942", fake_aiter):
        q, k, v = qkv(v=192)
        _aiter_backward(mha, q, k, v)
    assert fake_aiter.names() == ["mha_fwd", "fmha_v3_bwd"]
    _assert_aiter_backward_grads(q, k, v)


def test_guard_sends_mla_under_a_misdetected_arch_to_ck(fake_aiter, monkeypatch):
    """GPU_ARCHS ending in gfx950 on gfx942, causal q/k 192, v 128: aiter main's own backward
    reaches fmha_v3_bwd and fails; the guard sends it to CK. (0.1.7's gfx950 gate needs a
    mask-free call, so it picks CK itself; the guard's CK call changes nothing there.)"""
    monkeypatch.setenv("GPU_ARCHS", "gfx942;gfx950")
    mha = sys.modules["aiter.ops.mha"]
    with on_rocm("gfx942", fake_aiter):
        if fake_aiter.GENERATION == "main":
            with pytest.raises(RuntimeError, match="invalid argument for fmha_v3_bwd"):
                _aiter_backward(mha, *qkv())
        guard.install()
        fake_aiter.reset("gfx942")
        q, k, v = qkv()
        _aiter_backward(mha, q, k, v)
    assert fake_aiter.names() == ["mha_fwd", "mha_bwd"]
    _assert_aiter_backward_grads(q, k, v)


def test_guard_leaves_other_shapes_and_archs_to_aiter(fake_aiter, caplog):
    mha = sys.modules["aiter.ops.mha"]
    guard.install()
    with on_rocm("gfx942", fake_aiter), caplog.at_level(logging.INFO, logger="titan_rocm"):
        _aiter_backward(mha, *qkv(qk=128))
        _aiter_backward(mha, *qkv(qk=128))
    assert fake_aiter.names() == ["mha_fwd", "fmha_v3_bwd"] * 2  # aiter's own choice
    guard_lines = [r for r in caplog.records if "mla_ck_backward [guard]" in r.getMessage()]
    assert len(guard_lines) == 1 and "aiter (_flash_attn_backward)" in guard_lines[0].getMessage()


def test_guard_leaves_gfx950_to_aiter(fake_aiter):
    mha = sys.modules["aiter.ops.mha"]
    guard.install()
    with on_rocm("gfx950", fake_aiter):
        _aiter_backward(mha, *qkv())
    assert fake_aiter.names() == ["mha_fwd", GFX950_BACKWARD[fake_aiter.GENERATION]]


def _forward_args(generation, q, k, v):
    # _flash_attn_forward's positional parameters up to return_softmax, per release.
    if generation == "0.1.7":
        return (q, k, v, 0.0, 0.1, True, -1, -1, None, None, True, False)
    return (q, k, v, 0.0, 0.1, True, -1, -1, 0, None, None, None, None, None, True, False)


def test_guard_accepts_keyword_calls_and_fills_the_callers_buffers(fake_aiter, monkeypatch):
    monkeypatch.setenv("GPU_ARCHS", "gfx950")  # so that the guard, not aiter, picks CK
    mha = sys.modules["aiter.ops.mha"]
    guard.install()
    q, k, v = (t.detach() for t in qkv())
    with on_rocm("gfx942", fake_aiter):
        out, lse, _, rng = mha._flash_attn_forward(*_forward_args(fake_aiter.GENERATION, q, k, v))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dout = torch.ones_like(out)
        softmax_d = mha._flash_attn_backward(
            dout=dout, q=q, k=k, v=v, out=out, softmax_lse=lse, dq=dq, dk=dk, dv=dv,
            dbias=None, dropout_p=0.0, softmax_scale=0.1, causal=False, window_size_left=-1,
            window_size_right=-1, bias=None, alibi_slopes=None, deterministic=False,
            rng_state=rng,
        )
    assert fake_aiter.names()[-1] == "mha_bwd"
    assert softmax_d.shape == (2, 4, 32)
    qf, kf, vf = (t.float().transpose(1, 2).requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qf, kf, vf, scale=0.1).backward(dout.float().transpose(1, 2))
    assert_matches(dq, qf.grad.transpose(1, 2))
    assert_matches(dk, kf.grad.transpose(1, 2))
    assert_matches(dv, vf.grad.transpose(1, 2))


def _primus_like_module(mha) -> types.ModuleType:
    """A module that did ``from aiter.ops.mha import _flash_attn_backward`` at its import, as
    Primus-Turbo's attention_aiter_impl does, and calls it at backward time."""
    module = types.ModuleType("primus_like_attention")
    module._flash_attn_backward = mha._flash_attn_backward
    exec(  # a module-level function: it reads the module global when called
        "def backward(*args, **kwargs):\n    return _flash_attn_backward(*args, **kwargs)\n",
        module.__dict__,
    )
    return module


def test_guard_rebinds_the_name_in_modules_that_imported_it_first(fake_aiter, monkeypatch):
    mha = sys.modules["aiter.ops.mha"]
    primus = _primus_like_module(mha)
    monkeypatch.setitem(sys.modules, primus.__name__, primus)
    original = primus._flash_attn_backward
    status = guard.install()
    assert status == "patched; re-bound in primus_like_attention._flash_attn_backward"
    assert guard.is_guarded(primus._flash_attn_backward)
    assert guard.rebound() == ["primus_like_attention._flash_attn_backward"]
    monkeypatch.setenv("GPU_ARCHS", "gfx950")
    q, k, v = (t.detach() for t in qkv())
    with on_rocm("gfx942", fake_aiter):
        out, lse, _, rng = mha._flash_attn_forward(*_forward_args(fake_aiter.GENERATION, q, k, v))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        primus.backward(torch.ones_like(out), q, k, v, out, lse, dq, dk, dv, None, 0.0, 0.1,
                        False, -1, -1, None, None, False, rng)
    assert fake_aiter.names()[-1] == "mha_bwd"  # routed: the by-name import is covered
    guard.uninstall()
    assert primus._flash_attn_backward is original and guard.rebound() == []


# -- aiter_api -----------------------------------------------------------------------------


def test_calls_adapt_to_older_aiter_signatures():
    seen = {}

    def old_mha_bwd(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, is_causal,
                    window_size_left, window_size_right, deterministic, dq=None, dk=None,
                    dv=None, alibi_slopes=None, rng_state=None, gen=None):
        seen.update(locals())

    aiter_api.call_with_known(
        old_mha_bwd, "mha_bwd",
        {"dout": 1, "q": 2, "k": 3, "v": 4, "out": 5, "softmax_lse": 6, "dropout_p": 0.0,
         "softmax_scale": 0.1, "is_causal": True, "deterministic": False, "dq": 7, "dbias": None,
         "bias": None, "sink": None},
    )
    assert seen["window_size_left"] == -1 and seen["dq"] == 7 and "bias" not in seen

    def future(q, brand_new):
        raise AssertionError("must not be called")

    with pytest.raises(aiter_api.AiterUnavailable, match="requires parameter 'brand_new'"):
        aiter_api.call_with_known(future, "future", {"q": 1})

    def unreadable(*args, **kwargs):
        raise AssertionError("must not be called")

    with pytest.raises(aiter_api.AiterUnavailable, match="cannot read the parameters"):
        aiter_api.call_with_known(unreadable, "_no_such_op", {"q": 1})


def test_hidden_signatures_are_read_from_the_torch_ops_aiter_schema():
    """aiter's torch_compile_guard returns ``(*args, **kwargs)`` wrappers around
    ``torch.ops.aiter.<name>``, whose schema may start with a dummy tensor."""
    lib = torch.library.Library("aiter", "FRAGMENT")
    lib.define("_titan_rocm_probe(Tensor dummy, Tensor q, int window_size_left=-1) -> Tensor")

    def hidden(*args, **kwargs):
        raise AssertionError("not called")

    try:
        assert aiter_api.parameters(hidden, "_titan_rocm_probe") == [
            ("q", True), ("window_size_left", False)
        ]
        assert aiter_api.parameters(hidden, "_no_such_op") is None
    finally:
        lib._destroy()


# Parameters only one generation has, read through the kernels' op schemas.
ONLY_IN = {
    "0.1.7": {"mha_fwd": set(), "mha_bwd": set()},
    "main": {"mha_fwd": {"sink_size", "q_descale", "k_descale", "v_descale", "sink_ptr"},
             "mha_bwd": {"sink", "d_sink"}},
}


@pytest.mark.parametrize("kernel", ["mha_fwd", "mha_bwd", "mha_varlen_fwd", "mha_varlen_bwd"])
def test_kernels_are_wrappers_read_through_their_schema(fake_aiter, kernel):
    """As in the real aiter, every kernel is a ``(*args, **kwargs)`` wrapper: titan-rocm's
    calls go through the ``torch.ops.aiter`` schema path, per release."""
    fn = getattr(sys.modules["aiter.ops.mha"], kernel)
    assert str(inspect.signature(fn)) == "(*args, **kwargs)"
    names = {name for name, _ in aiter_api.parameters(fn, kernel)}
    assert {"q", "k", "v", "dropout_p", "softmax_scale", "is_causal"} <= names
    main_only = {"sink_size", "q_descale", "sink_ptr", "sink", "d_sink"}
    if fake_aiter.GENERATION == "0.1.7":
        assert not names & main_only
    else:
        assert ONLY_IN["main"].get(kernel, set()) <= names


def test_load_mha_off_rocm_names_what_is_missing(fake_aiter_path):
    with platform.override(cpu_facts()):
        with pytest.raises(aiter_api.AiterUnavailable, match="needs a ROCm build of torch"):
            aiter_api.load_mha()
    assert "aiter" not in sys.modules


def test_broken_aiter_import_is_reported_not_raised(tmp_path, monkeypatch):
    broken = tmp_path / "aiter"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('no ROCm: JIT setup failed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    facts = dataclasses.replace(PlatformFacts.simulated_rocm("gfx942"), simulated=False)
    reason = aiter_api.unavailable_reason(facts, try_import=True)
    assert reason == "import aiter.ops.mha failed: RuntimeError: no ROCm: JIT setup failed"
    ctx = Context(settings=RocmSettings(mla_ck_backward="on"), platform=facts)
    with platform.override(facts), pytest.raises(
        ValueError, match="cannot apply: aiter not usable: import aiter.ops.mha failed"
    ):
        MLACKBackward(ctx).require()


# -- the converter on TorchTitan 0.2.2's real models -----------------------------------------


def _job(*extra: str, flavor: str = "debugmodel", name: str = "deepseek_v3"):
    return parse("--model.name", name, "--model.flavor", flavor, *CONVERTER, *extra)


def _types(model: nn.Module) -> dict[str, type]:
    return {fqn: type(m) for fqn, m in model.named_modules()}


def test_converter_swaps_exactly_the_deepseek_attention_modules(caplog):
    job = _job()
    model = build_meta(job)
    before = _types(model)
    with platform.override(PlatformFacts.simulated_rocm("gfx942")), caplog.at_level(logging.INFO):
        decision = decisions(convert(job, model))["mla_ck_backward"]
    after = _types(model)
    assert decision.applied, decision.reason
    assert set(after) == set(before)  # no module added or removed
    changed = {fqn for fqn in before if before[fqn] is not after[fqn]}
    assert changed == {f"layers.{i}.{INNER}" for i in range(6)}
    assert all(after[fqn] is MLAInnerAttention for fqn in changed)
    assert "titan-rocm: rocm.mla_ck_backward applied" in caplog.text
    save_list = importlib.import_module(DEEPSEEK_PARALLELIZE)._op_sac_save_list
    assert set(op.FORWARD_OPS) <= save_list
    assert guard.hook_pending() and "aiter" not in sys.modules  # guard waits; aiter not imported
    details = decision.details
    json.dumps(details)
    assert {k: details[k] for k in ("arch", "shape", "backward", "modules")} == {
        "arch": "gfx942", "shape": {"qk": 192, "v": 128}, "backward": "ck (mha_bwd)",
        "modules": 6,
    }
    assert details["replaced"] == {"sdpa": 6} and details["dtype"] == "bfloat16"
    assert details["attention"] == "sdpa (causal): aiter dense attention"
    assert details["op_sac_save_list"] == f"{DEEPSEEK_PARALLELIZE}._op_sac_save_list"


@pytest.mark.parametrize(
    ("arch", "aiter", "forward_runs", "backward"),
    [("gfx942", "0.1.7", "CK mha_fwd", "ck (mha_bwd)"),
     ("gfx942", "main", "fmha_v3_fwd (ASM) for seqlen_q > 128, else CK mha_fwd", "ck (mha_bwd)"),
     ("gfx950", "0.1.7", "fmha_v3_fwd (ASM) for seqlen_q > 128, else CK mha_fwd",
      "aiter (_flash_attn_backward)"),
     ("gfx90a", "main", "CK mha_fwd", "ck (mha_bwd)")],
)
def test_plan_with_simulated_platform_imports_no_aiter_and_installs_nothing(
    arch, aiter, forward_runs, backward
):
    job = _job()
    model = build_meta(job)
    with platform.override(PlatformFacts.simulated_rocm(arch, aiter=aiter)), planning():
        ctx = job_context(job, world_of_one())
        w = MLACKBackward(ctx)
        assert w.gate(model) is None
        w.apply(model)
        plan = w.plan(model)
    assert plan["arch"] == arch and plan["backward"] == backward and plan["modules"] == 6
    assert plan["forward"] == "aiter (_flash_attn_forward)"
    assert plan["forward_runs"] == forward_runs
    assert plan["aiter"]["api"] == aiter and plan["aiter"]["get_gfx_matches_device"]
    assert plan["guard"] == "not installed (plan)" and not guard.hook_pending()
    assert "aiter" not in sys.modules


def test_plan_shows_a_misdetected_arch_and_the_routes_it_causes(monkeypatch):
    monkeypatch.setenv("GPU_ARCHS", "gfx942;gfx950")
    job = _job()
    model = build_meta(job)
    with platform.override(PlatformFacts.simulated_rocm("gfx942", aiter="0.1.7")), planning():
        plan = MLACKBackward(job_context(job, world_of_one())).plan(model)
    assert plan["aiter"]["get_gfx"] == "gfx950" and not plan["aiter"]["get_gfx_matches_device"]
    assert plan["forward"] == "ck (mha_fwd)"
    assert "told gfx950 by get_gfx()" in plan["forward_reason"]
    assert plan["backward"] == "ck (mha_bwd)"


def test_plan_of_an_unconverted_model_still_shows_the_route():
    job = _job()
    model = build_meta(job)
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        plan = MLACKBackward(job_context(job, world_of_one())).plan(model)
    assert plan["backward"] == "ck (mha_bwd)" and "replaced" not in plan
    assert plan["guard_not_covered"] == guard.NOT_COVERED


def test_auto_off_rocm_skips_with_one_line_and_touches_nothing(caplog):
    job = _job()
    model = build_meta(job)
    before = _types(model)
    with platform.override(cpu_facts()), caplog.at_level(logging.INFO):
        decision = decisions(convert(job, model))["mla_ck_backward"]
    assert not decision.applied
    assert decision.reason == "not a ROCm build (torch.version.hip is None)"
    lines = [r.getMessage() for r in caplog.records if "rocm.mla_ck_backward" in r.getMessage()]
    assert lines == ["titan-rocm: rocm.mla_ck_backward skipped: not a ROCm build "
                     "(torch.version.hip is None)"]
    assert _types(model) == before
    assert "aiter" not in sys.modules and not guard.hook_pending()


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("no_aiter", "aiter not usable: missing the aiter package"),
        ("no_gpu", "aiter not usable: missing a visible AMD GPU"),
        ("llama3", "model has no DeepSeek V3 MLA attention"),
        ("pp", "block_causal (per-document) masks under pipeline parallelism"),
        ("cp", "context parallelism is on"),
    ],
)
def test_auto_skips_with_the_reason(case, reason):
    facts = PlatformFacts.simulated_rocm("gfx942")
    parallel_dims = world_of_one()
    job = _job()
    if case == "no_aiter":
        facts = dataclasses.replace(facts, aiter_spec_found=False)
    elif case == "no_gpu":
        facts = dataclasses.replace(facts, device_count=0)
    elif case == "llama3":
        job = _job(name="llama3")
    elif case == "pp":
        job = _job(flavor="debugmodel_flex_attn")
        parallel_dims = Parallelism(world_size=2, pp=2)
    elif case == "cp":
        parallel_dims = Parallelism(world_size=2, cp=2)
    model = build_meta(job)
    before = _types(model)
    with platform.override(facts):
        w = MLACKBackward(job_context(job, parallel_dims))
        got = w.gate(model)
    assert got is not None and got.startswith(reason), got
    assert _types(model) == before


def test_flex_flavor_with_a_causal_mask_is_converted_in_auto():
    job = _job(flavor="debugmodel_flex_attn")
    model = build_meta(job)
    model.model_args.attn_mask_type = "causal"  # flex, but nothing beyond causal masking
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        decision = decisions(convert(job, model))["mla_ck_backward"]
    assert decision.applied, decision.reason
    assert decision.details["attention"] == "flex (causal mask): aiter dense attention"
    assert all(type(b.attention.inner_attention) is MLAFlexInnerAttention
               for b in model.layers.values())


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_block_causal_flavor_gets_varlen_attention_per_document(mode):
    from titan_rocm.workarounds.mla_ck_backward import documents

    job = _job("--rocm.mla_ck_backward", mode, flavor="debugmodel_flex_attn")
    model = build_meta(job)
    before = _types(model)
    with platform.override(PlatformFacts.simulated_rocm("gfx942", aiter="0.1.7")):
        decision = decisions(convert(job, model))["mla_ck_backward"]
    assert decision.applied, decision.reason
    after = _types(model)
    assert {f for f in before if before[f] is not after[f]} == {
        f"layers.{i}.{INNER}" for i in range(6)
    }
    assert {after[f"layers.{i}.{INNER}"] for i in range(6)} == {MLAVarlenInnerAttention}
    assert documents.installed(model)
    details = decision.details
    assert details["attention"].startswith("varlen (block_causal mask)")
    assert (details["forward"], details["forward_runs"]) == (
        "aiter (_flash_attn_varlen_forward)", "CK mha_varlen_fwd")
    assert (details["backward"], details["backward_runs"]) == (
        "ck (mha_varlen_bwd)", "CK mha_varlen_bwd")
    assert details["replaced"] == {"varlen": 6}
    assert "create_varlen_metadata_for_document" in details["document_masks"]


def test_drop_document_masks_runs_block_causal_flex_causal_with_a_warning(caplog):
    job = _job("--rocm.mla_ck_backward", "on", "--rocm.mla_document_masks", "drop",
               flavor="debugmodel_flex_attn")
    model = build_meta(job)
    before = _types(model)
    with platform.override(PlatformFacts.simulated_rocm("gfx942")), caplog.at_level(
        logging.WARNING
    ):
        decision = decisions(convert(job, model))["mla_ck_backward"]
    assert decision.applied, decision.reason
    after = _types(model)
    assert {f for f in before if before[f] is not after[f]} == {
        f"layers.{i}.{INNER}" for i in range(6)
    }
    assert {after[f"layers.{i}.{INNER}"] for i in range(6)} == {MLAFlexInnerAttention}
    assert "now run plain causal attention: tokens attend across document boundaries" in (
        caplog.text
    )
    assert decision.details["attention"].startswith("flex (block_causal mask dropped)")


def test_on_without_aiter_fails_at_startup_naming_what_is_missing():
    from torchtitan.protocols.model_converter import build_model_converters

    job = _job("--rocm.mla_ck_backward", "on")
    with platform.override(cpu_facts()), pytest.raises(ValueError) as info:
        build_model_converters(job, world_of_one())
    message = str(info.value)
    assert 'mla_ck_backward = "on" cannot apply: aiter not usable: missing' in message
    assert "a ROCm build of torch" in message and "the aiter package" in message


def test_on_with_context_parallel_fails_at_startup():
    job = _job("--rocm.mla_ck_backward", "on")
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        w = MLACKBackward(job_context(job, Parallelism(world_size=2, cp=2)))
        with pytest.raises(ValueError, match="cannot apply: context parallelism is on"):
            w.require()


def test_off_leaves_the_model_alone():
    job = _job("--rocm.mla_ck_backward", "off")
    model = build_meta(job)
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        decision = decisions(convert(job, model))["mla_ck_backward"]
    assert not decision.applied and "disabled by [rocm] mla_ck_backward" in decision.reason


@pytest.mark.parametrize(
    ("training_dtype", "fsdp", "tp", "expected"),
    [
        ("float32", True, False, "bfloat16"),  # FSDP mixed precision
        ("float32", False, False, "bfloat16"),  # single device: autocast
        ("float32", False, True, "float32"),  # TP without FSDP: no mixed precision in 0.2.2
        ("bfloat16", False, True, "bfloat16"),
    ],
)
def test_expected_attention_dtype_follows_torchtitan(training_dtype, fsdp, tp, expected):
    parallel = Parallelism(world_size=4, dp_shard=2 if fsdp else 1, tp=2 if tp else 1)
    ctx = Context(training_dtype=training_dtype, mixed_precision_param="bfloat16",
                  parallel=parallel)
    assert expected_attention_dtype(ctx) == expected


# -- with TorchTitan's float8 converter ------------------------------------------------------


class _Float8LinearStandIn(nn.Linear):
    """Marks a Linear swapped the way torchao's convert_to_float8_training does."""


class _Float8ConverterStandIn:
    """Stand-in for ``quantize.linear.float8`` (torchao is not installed here): it swaps
    every ``nn.Linear`` except the output projection, by class, as torchao does."""

    def __init__(self, job_config, parallel_dims) -> None:
        pass

    def convert(self, model: nn.Module) -> None:
        for module in model.modules():
            if type(module) is nn.Linear and module.out_features != 2048:
                module.__class__ = _Float8LinearStandIn

    def post_optimizer_hook(self, model) -> None:
        pass


def test_float8_converter_needs_torchao_here():
    """Why the next test uses a stand-in: 0.2.2's converter cannot be built without torchao."""
    pytest.importorskip("torchtitan")
    if importlib.util.find_spec("torchao") is not None:
        pytest.skip("torchao is installed; the stand-in is not needed")
    from torchtitan.protocols.model_converter import build_model_converters

    job = parse("--model.converters", "quantize.linear.float8",
                "--quantize.linear.float8.emulate")
    with pytest.raises(ImportError, match="torchao is not installed"):
        build_model_converters(job, world_of_one())


@pytest.mark.parametrize(
    "converters",
    ["quantize.linear.float8,rocm.mla_ck_backward", "rocm.mla_ck_backward,quantize.linear.float8",
     "quantize.linear.float8,rocm"],
)
def test_coexists_with_float8_in_one_converters_list(monkeypatch, converters):
    from torchtitan.protocols import model_converter

    monkeypatch.setitem(model_converter._registry_model_converter_cls,
                        "quantize.linear.float8", _Float8ConverterStandIn)
    job = parse("--model.name", "deepseek_v3", "--model.flavor", "debugmodel",
                "--model.converters", converters)
    assert job.model.converters == converters.split(",")
    model = build_meta(job)
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        container = convert(job, model)
    names = [type(c).__name__ for c in container.converters]
    assert len(names) == 2 and "_Float8ConverterStandIn" in names
    assert decisions(container)["mla_ck_backward"].applied
    attentions = [b.attention for b in model.layers.values()]
    assert all(type(a.inner_attention) is MLAInnerAttention for a in attentions)
    assert all(type(a.wkv_b) is _Float8LinearStandIn and type(a.wo) is _Float8LinearStandIn
               for a in attentions)
    assert type(model.output) is nn.Linear


# -- end to end: TorchTitan's own parallelize_fn (op SAC + compile) on the debug model -------


def test_debug_model_step_with_op_sac_and_compile(fake_aiter):
    """Convert, then 0.2.2's parallelize_deepseekv3 (selective op AC, optional compile):
    one forward/backward in bf16 calls aiter's forward once per layer (saved, not
    recomputed) and the CK backward once per layer. Two dense blocks: 0.2.2's MoE routing
    calls torch.histc on int64, which has no CPU kernel."""
    from torchtitan.protocols.train_spec import get_train_spec

    job = _job("--activation_checkpoint.mode", "selective",
               "--activation_checkpoint.selective_ac_option", "op",
               "--compile.enable", "--compile.backend", "aot_eager")
    args = model_args(job)
    args.n_layers = args.n_dense_layers = 2
    with torch.device("meta"):
        model = get_train_spec("deepseek_v3").model_cls(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)  # as FSDP's bf16 mixed precision would
    with on_rocm("gfx942", fake_aiter):
        assert decisions(convert(job, model))["mla_ck_backward"].applied
        model = get_train_spec("deepseek_v3").parallelize_fn(model, world_of_one(), job)
        assert all(isinstance(b, torch._dynamo.eval_frame.OptimizedModule)
                   for b in model.layers.values())
        tokens = torch.randint(0, 2048, (1, 32), generator=torch.Generator().manual_seed(0))
        logits = model(tokens)
        logits.float().square().mean().backward()
    names = fake_aiter.names()
    assert names.count("mha_fwd") == 2, names  # one per layer: SAC saved it
    assert names.count("mha_bwd") == 2 and "fmha_v3_bwd" not in names
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g.float()).all() for g in grads.values())
    assert any("attention.wq" in n and g.abs().sum() > 0 for n, g in grads.items())


def test_a_misdetected_arch_is_said_once_at_apply(monkeypatch, caplog):
    monkeypatch.setenv("GPU_ARCHS", "gfx942;gfx950")
    with platform.override(PlatformFacts.simulated_rocm("gfx942", aiter="main")), \
            caplog.at_level(logging.WARNING, logger="titan_rocm"):
        for _ in range(2):
            job = _job()
            assert decisions(convert(job, build_meta(job)))["mla_ck_backward"].applied
    said = [r.getMessage() for r in caplog.records if "get_gfx() answers" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("titan-rocm: mla_ck_backward: aiter's get_gfx() answers gfx950 "
                              "(simulated; last entry of GPU_ARCHS='gfx942;gfx950') but the "
                              "device is gfx942")
    assert "set GPU_ARCHS=gfx942 to make aiter agree" in said[0]
