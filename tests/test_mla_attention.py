"""rocm.mla_ck_backward on CPU: custom ops, module, guard and converter against a fake aiter.

The real aiter needs ROCm; these tests put ``tests/fake_aiter`` on ``sys.path`` (fixture
``fake_aiter_path``) and simulate the ROCm arch with ``platform.override``. The fake records
which aiter kernel each call reached and computes it with an fp32 reference attention.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import json
import logging
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from moe_test_models import build_meta, convert, decisions, model_args, parse, world_of_one

from titan_rocm import platform
from titan_rocm.converters.context import job_context
from titan_rocm.platform import PlatformFacts
from titan_rocm.settings import RocmSettings
from titan_rocm.workarounds.base import Context, Parallelism, planning
from titan_rocm.workarounds.mla_attention import aiter_api, guard, op, route_log
from titan_rocm.workarounds.mla_attention.module import MLAFlexInnerAttention, MLAInnerAttention
from titan_rocm.workarounds.mla_attention.workaround import (
    DEEPSEEK_PARALLELIZE,
    MLACKBackward,
    expected_attention_dtype,
)

FAKE_AITER = Path(__file__).resolve().parent / "fake_aiter"
INNER = "attention.inner_attention"
CONVERTER = ("--model.converters", "rocm.mla_ck_backward")


# -- fixtures ------------------------------------------------------------------------------


def _drop_aiter_modules() -> None:
    for name in [m for m in sys.modules if m == "aiter" or m.startswith("aiter.")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def _clean_process_state(monkeypatch):
    """Each test starts and ends without aiter loaded, guard hooks, logged routes or SAC ops."""
    monkeypatch.delenv("GPU_ARCHS", raising=False)
    _drop_aiter_modules()
    yield
    guard.uninstall()
    _drop_aiter_modules()
    route_log.forget()
    save_list = importlib.import_module(DEEPSEEK_PARALLELIZE)._op_sac_save_list
    save_list.discard(op.FORWARD_OP)


@pytest.fixture
def fake_aiter_path(monkeypatch):
    """The fake aiter importable (nothing imported yet)."""
    monkeypatch.syspath_prepend(str(FAKE_AITER))
    importlib.invalidate_caches()


@pytest.fixture
def fake_aiter(fake_aiter_path):
    """The fake aiter imported; its control module (device arch gfx942, no calls yet)."""
    fake = importlib.import_module("aiter._fake")
    fake.reset("gfx942")
    return fake


@contextlib.contextmanager
def on_rocm(arch: str, fake=None):
    """Simulated ROCm facts for ``arch`` (and the fake aiter's device, when given)."""
    if fake is not None:
        fake.reset(arch)
    with platform.override(PlatformFacts.simulated_rocm(arch)):
        yield


def _cpu_facts(**changes) -> PlatformFacts:
    facts = PlatformFacts("2.13", None, None, 0, None, None, None, "3.9.0", False)
    return dataclasses.replace(facts, **changes)


# -- reference -----------------------------------------------------------------------------


def _qkv(batch=2, seqlen=32, heads=4, qk=192, v=128, dtype=torch.bfloat16, seed=0):
    """bshd q, k, v (aiter's layout) as leaf tensors needing grad."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, seqlen, heads, qk), (batch, seqlen, heads, qk), (batch, seqlen, heads, v))
    return [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]


def _reference(q, k, v, scale, dout):
    """fp32 SDPA (causal) of bshd inputs: (out, dq, dk, dv)."""
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(
        qf.transpose(1, 2), kf.transpose(1, 2), vf.transpose(1, 2), scale=scale, is_causal=True
    ).transpose(1, 2)
    out.backward(dout.float())
    return out.detach(), qf.grad, kf.grad, vf.grad


def _assert_matches(got, want, tol=2e-2):
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def _aiter_backward(mha, q, k, v):
    """aiter's own flash_attn_func, as Primus-Turbo calls it (non-deterministic backward)."""
    out = mha.flash_attn_func(
        q, k, v, softmax_scale=0.1, causal=True, deterministic=False, return_lse=True
    )[0]
    out.backward(torch.ones_like(out))


# -- the custom ops ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "backward_kernel"),
    [("gfx942", "mha_bwd"), ("gfx90a", "mha_bwd"), ("gfx950", "fmha_v3_bwd")],
)
def test_gradients_through_the_op_match_reference_attention(fake_aiter, arch, backward_kernel):
    q, k, v = _qkv()
    with on_rocm(arch, fake_aiter):
        out = op.mla_flash_attention(q, k, v, softmax_scale=0.1, causal=True)
        dout = torch.randn_like(out)
        out.backward(dout)
    ref_out, dq, dk, dv = _reference(q, k, v, 0.1, dout)
    _assert_matches(out, ref_out)
    _assert_matches(q.grad, dq)
    _assert_matches(k.grad, dk)
    _assert_matches(v.grad, dv)
    assert fake_aiter.names() == ["mha_fwd", backward_kernel]
    details = fake_aiter.CALLS[-1][1]
    assert details["v_shape"][-1] == 128 and details["dout_shape"][-1] == 128  # never padded
    assert details["q_shape"][-1] == 192 and details["causal"] is True


def test_long_sequences_take_aiters_fast_forward(fake_aiter):
    q, k, v = _qkv(batch=1, seqlen=160, heads=2)
    with on_rocm("gfx942", fake_aiter):
        op.mla_flash_attention(q, k, v, softmax_scale=0.1).sum().backward()
    assert fake_aiter.names() == ["fmha_v3_fwd", "mha_bwd"]


def test_misdetected_arch_still_routes_by_the_device(fake_aiter, monkeypatch):
    """GPU_ARCHS="gfx942;gfx950" fools aiter's get_gfx(), not titan-rocm's routing."""
    monkeypatch.setenv("GPU_ARCHS", "gfx942;gfx950")
    mha = sys.modules["aiter.ops.mha"]
    with on_rocm("gfx942", fake_aiter):
        q, k, v = _qkv()
        with pytest.raises(RuntimeError, match="invalid argument for fmha_v3_bwd"):
            _aiter_backward(mha, q, k, v)  # aiter alone: the failure this workaround is for
        q, k, v = _qkv()
        op.mla_flash_attention(q, k, v, softmax_scale=0.1).sum().backward()
    assert fake_aiter.names()[-2:] == ["mha_fwd", "mha_bwd"]
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()


def test_route_logged_once_per_shape(fake_aiter, caplog):
    with on_rocm("gfx942", fake_aiter), caplog.at_level(logging.INFO, logger="titan_rocm"):
        for _ in range(2):
            q, k, v = _qkv()
            op.mla_flash_attention(q, k, v, softmax_scale=0.1).sum().backward()
        q, k, v = _qkv(qk=128)
        op.mla_flash_attention(q, k, v, softmax_scale=0.1).sum().backward()
    lines = [r.getMessage() for r in caplog.records if "mla_ck_backward [op]" in r.getMessage()]
    assert len(lines) == 2
    assert "gfx942 q/k 192, v 128, bfloat16: backward -> ck (mha_bwd)" in lines[0]
    assert "q/k 128, v 128, bfloat16: backward -> aiter (_flash_attn_backward)" in lines[1]


def test_opcheck_schema_fake_and_autograd_registration(fake_aiter):
    q, k, v = _qkv(batch=1, seqlen=24, heads=2)
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
            q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in _qkv(seed=1))
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
    q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in _qkv())
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
    _assert_matches(y_swapped, y_stock)
    for name, grad in g_stock.items():
        rel = (g_swapped[name].float() - grad.float()).norm() / grad.float().norm()
        assert rel < 3e-2, (name, float(rel))
    assert fake_aiter.names() == ["mha_fwd", "mha_bwd"]


def test_inputs_aiter_cannot_take_fall_back_to_sdpa_and_log_once(fake_aiter, caplog):
    module = MLAInnerAttention()
    q, k, v = (t.transpose(1, 2) for t in _qkv(dtype=torch.float32))
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
     (MLAFlexInnerAttention, "FlexAttentionWrapper")],
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
    q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in _qkv())
    with on_rocm("gfx942", fake_aiter):
        out = module(q, k, v, block_mask=mask, scale=0.1)
        out.backward(torch.ones_like(out))
        with pytest.raises(NotImplementedError, match="score_mod"):
            module(q, k, v, block_mask=mask, score_mod=lambda s, *_: s)
    ref, dq, _, dv = _reference(*(t.transpose(1, 2) for t in (q, k, v)), 0.1,
                                torch.ones(2, 32, 4, 128))
    _assert_matches(out.transpose(1, 2), ref)
    _assert_matches(q.grad.transpose(1, 2), dq)
    _assert_matches(v.grad.transpose(1, 2), dv)
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


def test_guard_sends_padded_v_on_gfx942_to_ck(fake_aiter):
    """A caller that pads v to 192 (the failing path) gets CK once the guard is in."""
    mha = sys.modules["aiter.ops.mha"]
    with on_rocm("gfx942", fake_aiter):
        with pytest.raises(RuntimeError, match="invalid argument for fmha_v3_bwd"):
            _aiter_backward(mha, *_qkv(v=192))
        guard.install()
        fake_aiter.reset("gfx942")
        q, k, v = _qkv(v=192)
        _aiter_backward(mha, q, k, v)
    assert fake_aiter.names() == ["mha_fwd", "mha_bwd"]
    _, dq, dk, dv = _reference(q, k, v, 0.1, torch.ones(2, 32, 4, 192))
    _assert_matches(q.grad, dq)
    _assert_matches(v.grad, dv)


def test_guard_leaves_other_shapes_and_archs_to_aiter(fake_aiter, caplog):
    mha = sys.modules["aiter.ops.mha"]
    guard.install()
    with on_rocm("gfx942", fake_aiter), caplog.at_level(logging.INFO, logger="titan_rocm"):
        _aiter_backward(mha, *_qkv(qk=128))
        _aiter_backward(mha, *_qkv(qk=128))
    assert fake_aiter.names() == ["mha_fwd", "fmha_v3_bwd"] * 2  # aiter's own choice
    guard_lines = [r for r in caplog.records if "mla_ck_backward [guard]" in r.getMessage()]
    assert len(guard_lines) == 1 and "aiter (_flash_attn_backward)" in guard_lines[0].getMessage()
    with on_rocm("gfx950", fake_aiter):
        _aiter_backward(mha, *_qkv())
    assert fake_aiter.names() == ["mha_fwd", "fmha_v3_bwd"]


def test_guard_accepts_keyword_calls_and_fills_the_callers_buffers(fake_aiter):
    mha = sys.modules["aiter.ops.mha"]
    guard.install()
    q, k, v = (t.detach() for t in _qkv())
    with on_rocm("gfx942", fake_aiter):
        out, lse, _, rng = mha._flash_attn_forward(
            q, k, v, 0.0, 0.1, True, -1, -1, 0, None, None, None, None, None, True, False
        )
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dout = torch.ones_like(out)
        softmax_d = mha._flash_attn_backward(
            dout=dout, q=q, k=k, v=v, out=out, softmax_lse=lse, dq=dq, dk=dk, dv=dv,
            dbias=None, dropout_p=0.0, softmax_scale=0.1, causal=True, window_size_left=-1,
            window_size_right=-1, bias=None, alibi_slopes=None, deterministic=False,
            rng_state=rng,
        )
    assert fake_aiter.names()[-1] == "mha_bwd"
    assert softmax_d.shape == (2, 4, 32)
    _, rq, rk, rv = _reference(q, k, v, 0.1, dout)
    _assert_matches(dq, rq)
    _assert_matches(dk, rk)
    _assert_matches(dv, rv)


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


def test_load_mha_off_rocm_names_what_is_missing(fake_aiter_path):
    with platform.override(_cpu_facts()):
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
    assert op.FORWARD_OP in importlib.import_module(DEEPSEEK_PARALLELIZE)._op_sac_save_list
    assert guard.hook_pending() and "aiter" not in sys.modules  # guard waits; aiter not imported
    details = decision.details
    json.dumps(details)
    assert {k: details[k] for k in ("arch", "shape", "backward", "modules")} == {
        "arch": "gfx942", "shape": {"qk": 192, "v": 128}, "backward": "ck (mha_bwd)",
        "modules": 6,
    }
    assert details["replaced"] == 6 and details["dtype"] == "bfloat16"
    assert details["op_sac_save_list"] == f"{DEEPSEEK_PARALLELIZE}._op_sac_save_list"


@pytest.mark.parametrize(
    ("arch", "backward"),
    [("gfx942", "ck (mha_bwd)"), ("gfx950", "aiter (_flash_attn_backward)"),
     ("gfx90a", "ck (mha_bwd)")],
)
def test_plan_with_simulated_arch_imports_no_aiter_and_installs_nothing(arch, backward):
    job = _job()
    model = build_meta(job)
    with platform.override(PlatformFacts.simulated_rocm(arch)), planning():
        ctx = job_context(job, world_of_one())
        w = MLACKBackward(ctx)
        assert w.gate(model) is None
        w.apply(model)
        plan = w.plan(model)
    assert plan["arch"] == arch and plan["backward"] == backward and plan["modules"] == 6
    assert plan["forward"] == "aiter flash attention (_flash_attn_forward)"
    assert plan["guard"] == "not installed (plan)" and not guard.hook_pending()
    assert "aiter" not in sys.modules


def test_plan_of_an_unconverted_model_still_shows_the_route():
    job = _job()
    model = build_meta(job)
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        plan = MLACKBackward(job_context(job, world_of_one())).plan(model)
    assert plan["backward"] == "ck (mha_bwd)" and "replaced" not in plan


def test_auto_off_rocm_skips_with_one_line_and_touches_nothing(caplog):
    job = _job()
    model = build_meta(job)
    before = _types(model)
    with platform.override(_cpu_facts()), caplog.at_level(logging.INFO):
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
        ("flex", "attention is FlexAttention with 'block_causal' (per-document) masks"),
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
    elif case == "flex":
        job = _job(flavor="debugmodel_flex_attn")
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
    assert decision.details["attention"] == "flex (causal mask)"
    assert all(type(b.attention.inner_attention) is MLAFlexInnerAttention
               for b in model.layers.values())


def test_on_alone_keeps_document_masks(caplog):
    job = _job("--rocm.mla_ck_backward", "on", flavor="debugmodel_flex_attn")
    model = build_meta(job)
    before = _types(model)
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        decision = decisions(convert(job, model))["mla_ck_backward"]
    assert not decision.applied
    assert 'mla_document_masks = "drop"' in decision.reason
    assert _types(model) == before


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
    assert decision.details["attention"] == "flex (block_causal mask)"


def test_on_without_aiter_fails_at_startup_naming_what_is_missing():
    from torchtitan.protocols.model_converter import build_model_converters

    job = _job("--rocm.mla_ck_backward", "on")
    with platform.override(_cpu_facts()), pytest.raises(ValueError) as info:
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
