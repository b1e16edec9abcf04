"""MLA on aiter on TorchTitan main's folded tokens (q/k/v ``(T, N, H)``, pytorch/torchtitan
#4121): the folded seam, through aiter's varlen entry points, against main's own attention.

The main-shaped classes are ``tests/support/tt_main_attention.py``'s stand-in (main's
attention at b5bcd76c on TorchTitan 0.3.0's classes; CI has only 0.2.2 and 0.3.0) or, where
the installed TorchTitan folds its tokens, TorchTitan main itself. The adapter takes the
folded seam as it does on main: from ``torchtitan_version.detect()``'s variant (made to say
so over 0.3.0's files). Stock attention for comparison: main's FlexAttention (eager) under
main's own ``BlockMask`` for the output, SDPA under that mask evaluated densely for the
gradients (flex attention has no CPU backward); for dropped masks, SDPA causal within each
row.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from tt030_harness import build_bf16, convert_mla

from tests.support.mla_test_support import (
    assert_compiled_matches_eager,
    assert_grads_close,
    assert_matches,
    on_rocm,
    varlen_backward_kernel,
)
from tests.support.tt_main_attention import evaluated, main_attention, sdpa_tokens
from titan_rocm import torchtitan_version

pytestmark = pytest.mark.usefixtures("clean_mla_state")

STARTS = (5, 17, 32, 41)
"""Document starts after 0 in 64 folded tokens."""
TOKENS = 64
CU_SEQLENS = [0, 5, 17, 32, 41, 64]
FORWARD = {"0.1.7": "mha_varlen_fwd", "main": "fmha_v3_varlen_fwd"}
"""The varlen forward kernel on gfx942, per fake generation (q/k 192, v 128)."""


def _positions(starts=STARTS, tokens=TOKENS) -> torch.Tensor:
    positions = torch.arange(tokens)
    for start in starts:
        positions[start:] = torch.arange(tokens - start)
    return positions


@pytest.fixture
def main(monkeypatch) -> Any:
    """The main-shaped classes; the installed TorchTitan detected as folding its tokens;
    flex attention and its mask eager (CPU, fast)."""
    from torch.nn.attention.flex_attention import flex_attention
    from torchtitan.models.common.attention import FlexAttention

    classes = main_attention()
    if not classes.real:
        detect = torchtitan_version.detect
        monkeypatch.setattr(torchtitan_version, "detect", lambda *a: dataclasses.replace(
            detect(*a), variants=(torchtitan_version.FOLDED_TOKENS,)))
    monkeypatch.setattr(FlexAttention, "_compiled_flex_attn", flex_attention)
    if classes.real:
        import torchtitan.models.common.decoder as decoder
        from torch.nn.attention.flex_attention import create_block_mask

        monkeypatch.setattr(decoder, "create_attention_mask", create_block_mask)
    return classes


def _config(main: Any, inner: Any = None) -> Any:
    """Main's DeepSeek debug model cut to two dense blocks (MoE routing has no CPU kernel)."""
    config = main.debugmodel()
    model = config.model_spec.model
    model.layers = [copy.deepcopy(model.layers[0]) for _ in range(2)]
    for layer in model.layers:
        if inner is not None:
            sharding = layer.attention.inner_attention.sharding_config
            layer.attention.inner_attention = inner(sharding_config=sharding)
    return config


_build = build_bf16
_convert = convert_mla


class _SdpaUnderTheMask(torch.nn.Module):
    """Stock reference with a backward: SDPA under main's BlockMask, evaluated densely."""

    def forward(self, q_TNH, k_TNH, v_TNH, *, attention_masks, scale=None, **kwargs):
        return sdpa_tokens(q_TNH, k_TNH, v_TNH, evaluated(attention_masks, q_TNH.shape[0]),
                           scale)


def _logits_and_grads(model, tokens, positions, masks):
    logits = model(tokens, positions=positions, attention_masks=masks)
    logits.float().square().mean().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_converted_main_deepseek_matches_its_flex_attention_per_document(fake_aiter, main):
    from titan_rocm.workarounds.mla_ck_backward.documents import dense_mask
    from titan_rocm.workarounds.mla_ck_backward.folded_tt030 import MLAFoldedVarlenAttention

    config = _config(main)
    stock = _build(config)
    converted = copy.deepcopy(stock)
    positions = _positions()
    tokens = torch.randint(0, 2048, (TOKENS,), generator=torch.Generator().manual_seed(3))
    with on_rocm("gfx942", fake_aiter):
        decision = _convert(config, converted)
        assert decision.applied and decision.details["replaced"] == {"varlen": 2}
        masks = converted.get_attention_masks(positions)
        ours, our_grads = _logits_and_grads(converted, tokens, positions, masks)

    # Main's own mask dispatch hands the folded tokens' document boundaries to the varlen path.
    assert isinstance(masks, main.VarlenMetadata) and masks.cu_seq_q.tolist() == CU_SEQLENS
    block_mask = stock.get_attention_masks(positions)
    assert torch.equal(dense_mask(masks.cu_seq_q, 1, TOKENS), evaluated(block_mask, TOKENS))
    assert type(converted.config.first_attention.inner_attention) is \
        MLAFoldedVarlenAttention.Config
    assert type(config.model_spec.model.first_attention.inner_attention) is \
        main.FlexAttention.Config
    assert ours.shape == (TOKENS, config.model_spec.model.vocab_size)

    with torch.no_grad():
        flex = stock(tokens, positions=positions, attention_masks=block_mask)
    assert_matches(ours, flex, tol=3e-2)
    for block in stock.layers.values():
        block.attention.inner_attention = _SdpaUnderTheMask()
    stock_logits, stock_grads = _logits_and_grads(stock, tokens, positions, block_mask)
    assert_matches(stock_logits, flex, tol=3e-2)
    assert_grads_close(our_grads, stock_grads)
    names = fake_aiter.names()
    assert names.count(FORWARD[fake_aiter.GENERATION]) == 2, names
    # q/k 192, v 128: the CK backward, or #4875's FlyDSL kernel with the newest main
    assert names.count(varlen_backward_kernel(fake_aiter)) == 2, names
    segments = list(zip(CU_SEQLENS, CU_SEQLENS[1:], strict=False))
    assert all(details["segments"] == segments for _, details in fake_aiter.CALLS)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_stock_varlen_gets_the_folded_replacement_and_main_s_metadata(fake_aiter, main, arch):
    """Main's causal VarlenAttention: the same replacement, TorchTitan's VarlenMetadata;
    equal to main's varlen attention (SDPA under the per-document mask on CPU)."""
    config = _config(main, inner=main.VarlenAttention.Config)
    stock = _build(config)
    converted = copy.deepcopy(stock)
    positions = _positions()
    tokens = torch.randint(0, 2048, (TOKENS,), generator=torch.Generator().manual_seed(4))
    with on_rocm(arch, fake_aiter):
        assert _convert(config, converted).details["replaced"] == {"varlen": 2}
        masks = converted.get_attention_masks(positions)
        ours, our_grads = _logits_and_grads(converted, tokens, positions, masks)
    block_mask = _build(_config(main)).get_attention_masks(positions)
    for block in stock.layers.values():
        block.attention.inner_attention = _SdpaUnderTheMask()
    stock_logits, stock_grads = _logits_and_grads(stock, tokens, positions, block_mask)
    assert_matches(ours, stock_logits, tol=3e-2)
    assert_grads_close(our_grads, stock_grads)
    # gfx950: aiter's own dispatch picks CK
    assert fake_aiter.names().count(varlen_backward_kernel(fake_aiter, arch)) == 2


def test_dropped_masks_run_causal_rows_of_max_context_length_through_varlen(fake_aiter,
                                                                             main):
    """``mla_document_masks = "drop"``: causal within each ``max_context_length`` row of the
    folded tokens (a batch of rows folded), across documents: cu_seqlens at multiples of the
    row length, the last row shorter; equal to SDPA causal within each row."""
    from titan_rocm.workarounds.mla_ck_backward.folded_tt030 import MLAFoldedRowsAttention

    config = _config(main)
    model = _build(config)
    with on_rocm("gfx942", fake_aiter):
        decision = _convert(config, model, mla_document_masks="drop")
    assert decision.details["replaced"] == {"rows": 2}
    assert decision.details["attention"].startswith("flex (block_causal mask dropped): aiter "
                                                    "varlen attention")
    inner = model.layers["0"].attention.inner_attention
    assert type(inner) is MLAFoldedRowsAttention
    assert inner.row_length == config.model_spec.model.max_context_length == 2048

    module = MLAFoldedRowsAttention.Config(row_length=16).build()
    gen = torch.Generator().manual_seed(6)
    shapes = ((40, 4, 192), (40, 4, 192), (40, 4, 128))
    q, k, v = (torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_()
               for s in shapes)
    rows = torch.arange(40) // 16
    mask = ((rows[:, None] == rows[None, :]) & torch.ones(40, 40, dtype=torch.bool).tril())
    fake_aiter.reset("gfx942")
    with on_rocm("gfx942", fake_aiter):
        out = module(q, k, v, attention_masks=None, scale=0.1)
    dout = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
    out.backward(dout)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    want = sdpa_tokens(qf, kf, vf, mask[None, None], 0.1)
    want.backward(dout.float())
    for got, ref in ((out, want), (q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad)):
        assert_matches(got, ref)
    assert all(details["segments"] == [(0, 16), (16, 32), (32, 40)]
               for _, details in fake_aiter.CALLS)
    assert fake_aiter.names() == [FORWARD[fake_aiter.GENERATION],
                                  varlen_backward_kernel(fake_aiter)]


def test_replacements_take_main_s_sharding_names_and_the_stock_fields(fake_aiter, main):
    """Main keys the inner attention's sharding on q_TNH/k_TNH/v_TNH; both folded
    replacements take those names and carry the stock sharding config and Flex's fields."""
    for masks in ("keep", "drop"):
        config = _config(main)
        stock_inner = config.model_spec.model.layers[0].attention.inner_attention
        stock_inner.block_size = 64
        model = _build(config)
        with on_rocm("gfx942", fake_aiter):
            assert _convert(config, model, mla_document_masks=masks).applied
        inner = model.layers["0"].attention.inner_attention
        sharding = inner._sharding_config
        assert sharding is not None and sharding == stock_inner.sharding_config
        assert inner._cache_pos_arg_names() == list(main.sharding_names)
        assert set(inner._cache_pos_arg_names()) <= set(sharding.in_dst_shardings)
        if masks == "drop":
            assert model.config.layers[0].attention.inner_attention.block_size == 64


def test_gate_on_folded_tokens(fake_aiter, main):
    """SDPA is not replaced (main refuses it for language models); pipeline parallelism is
    no reason (each microbatch gets its own metadata); context parallelism still is."""
    from torchtitan.models.common.attention import ScaledDotProductAttention

    from titan_rocm.workarounds.base import Parallelism
    from titan_rocm.workarounds.mla_ck_backward.kinds import ROWS
    from titan_rocm.workarounds.mla_ck_backward.seams_tt030 import check_folded

    config = _config(main, inner=ScaledDotProductAttention.Config)
    with on_rocm("gfx942", fake_aiter):
        decision = _convert(config, _build(config))
        assert decision.reason == (
            "attention runs ScaledDotProductAttention; rocm.mla_ck_backward replaces only "
            "TorchTitan's FlexAttention and causal VarlenAttention (on folded (T, N, H) "
            "tokens, where language models refuse ScaledDotProductAttention)")
        for pp, cp, masks, reason in ((2, 1, "keep", None), (2, 1, "drop", None),
                                      (1, 2, "keep", "context parallelism is on")):
            config = _config(main)
            got = _convert(config, _build(config), Parallelism(world_size=2, pp=pp, cp=cp),
                           mla_document_masks=masks)
            assert got.reason.startswith(reason) if reason else got.applied, (pp, cp, got)
    assert check_folded(torch.nn.Module(), {"layers.0.attention": ROWS}) == (
        'mla_document_masks = "drop" on folded tokens cuts them into rows of the model\'s '
        "max_context_length, and model.config has none")


def test_compiled_folded_varlen_serves_changing_documents_with_one_graph(fake_aiter, main):
    """The document count and the longest document change every batch: Dynamo recompiles
    once, then one fullgraph graph serves every layout, equal to eager."""
    from torch._dynamo.utils import counters

    from titan_rocm.workarounds.mla_ck_backward.folded_tt030 import MLAFoldedVarlenAttention

    module = MLAFoldedVarlenAttention.Config().build()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(5)
    with on_rocm("gfx942", fake_aiter):
        for starts in ((4, 11, 20), (7, 35), (2, 3, 30, 50), (10,)):
            masks = main.create_varlen_metadata_for_document(_positions(starts))
            shapes = ((TOKENS, 4, 192), (TOKENS, 4, 192), (TOKENS, 4, 128))
            qkv = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]
            assert_compiled_matches_eager(module, compiled, qkv, attention_masks=masks,
                                          scale=0.1)
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


# -- the plan --------------------------------------------------------------------------------------


def _plan_args(main: Any) -> list[str]:
    if main.real:
        return ["--module", "titan_rocm.torchtitan.configs", "--config", "deepseek_v3_debugmodel"]
    return ["--module", "tests.support.tt_main_attention", "--config",
            "deepseek_v3_debugmodel_rocm"]


CK_BACKWARD = ("ck (mha_varlen_bwd)", "CK mha_varlen_bwd")


@pytest.mark.parametrize(("aiter", "forward_runs", "backward"), [
    ("0.1.7", "CK mha_varlen_fwd", CK_BACKWARD),
    ("e4048607", "fmha_v3_varlen_fwd (ASM)", CK_BACKWARD),
    # ROCm/aiter#4875: aiter's own varlen backward runs its FlyDSL kernel on gfx942.
    ("main", "fmha_v3_varlen_fwd (ASM)",
     ("aiter (_flash_attn_varlen_backward)", "flydsl_flash_attn_varlen_bwd (FlyDSL)"))])
def test_plan_on_main_applies_mla_with_the_varlen_route(capsys, main, aiter, forward_runs,
                                                         backward):
    import json

    from titan_rocm.cli import main as cli

    args = ["plan", *_plan_args(main), "--arch", "gfx942", "--aiter", aiter]
    assert cli([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    decision = next(d for d in plan["workarounds"] if d["workaround"] == "mla_ck_backward")
    details = decision["details"]
    assert decision["applied"], decision["reason"]
    assert details["attention"].startswith("varlen (block_causal mask)")
    assert (details["modules"], details["replaced"]) == (6, {"varlen": 6})
    assert (details["forward"], details["forward_runs"]) == (
        "aiter (_flash_attn_varlen_forward)", forward_runs)
    assert (details["backward"], details["backward_runs"]) == backward
    assert "over the folded tokens" in details["document_masks"]
    assert cli([*args, "--rocm.mla_document_masks", "drop"]) == 0
    text = capsys.readouterr().out
    assert "rocm.mla_ck_backward    applied" in text
    assert "max_context_length row of the folded tokens" in text and "rows: 6" in text
    assert f"backward: {backward[0]}" in text
