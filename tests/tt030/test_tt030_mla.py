"""MLA on aiter on TorchTitan 0.3.0: the real DeepSeek V3 debug model with per-document masks,
converted (titan-rocm's inner-attention configs, the varlen path through the fake aiter of
both generations), against stock attention with the same document boundaries: FlexAttention
for the logits, SDPA under TorchTitan's own mask for the gradients (FlexAttention has no CPU
backward); then the real trainer; the plan.

Documents: several per sample, starts differing between the samples of a batch (0.3.0 reads a
document start where ``positions`` resets to 0).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tt030_harness import build_bf16, convert_mla, document_positions

from tests.support.mla_test_support import (
    assert_compiled_matches_eager,
    assert_grads_close,
    assert_matches,
    on_rocm,
    varlen_backward_kernel,
)

pytestmark = pytest.mark.usefixtures("clean_mla_state")

SEQLEN = 32
STARTS = ([5, 17], [9])
"""Document starts after 0, per sample: cu_seqlens [0, 5, 17, 32, 41, 64]."""
CU_SEQLENS = [0, 5, 17, 32, 41, 64]
FORWARD = {"0.1.7": "mha_varlen_fwd", "main": "fmha_v3_varlen_fwd"}
"""The varlen forward kernel on gfx942, per fake generation (q/k 192, v 128)."""
ONLY_MLA = {name: "off" for name in ("precision_casts", "moe_eager_compile", "grouped_mm",
                                     "triton_war", "divergence_guard", "gemm_lookup")}
"""Settings leaving mla_ck_backward the only workaround, so runs differ by attention alone."""


def _positions(starts=STARTS, seqlen=SEQLEN) -> torch.Tensor:
    return torch.stack([document_positions(seqlen, s) for s in starts])


def _deepseek_config(layers: int = 2) -> Any:
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel

    config = deepseek_v3_debugmodel()
    config.model_spec.model.layers = config.model_spec.model.layers[:layers]
    config.model_spec.model.update_from_config(config=config)  # sharding configs, as the trainer
    return config


_build = build_bf16  # the debug model: layer 0 dense, layer 1 MoE
_convert = convert_mla


def _flex_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """TorchTitan's FlexAttention and its mask, uncompiled (CPU, fast)."""
    import torchtitan.models.common.decoder as decoder
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torchtitan.models.common.attention import FlexAttention

    monkeypatch.setattr(FlexAttention, "_compiled_flex_attn", flex_attention)
    monkeypatch.setattr(decoder, "create_attention_mask", create_block_mask)


def _evaluated(block_mask: Any, batch: int, seqlen: int) -> torch.Tensor:
    """(batch, 1, seqlen, seqlen): a BlockMask's own mask_mod over every (query, key)."""
    b = torch.arange(batch)[:, None, None]
    i = torch.arange(seqlen)[None, :, None]
    j = torch.arange(seqlen)[None, None, :]
    return block_mask.mask_mod(b, torch.zeros((), dtype=torch.long), i, j)[:, None]


class _SdpaUnderTheMask(torch.nn.Module):
    """Stock reference with a backward: SDPA under TorchTitan's BlockMask, evaluated densely."""

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, scale=None, **kwargs):
        batch, seqlen = q_BLNH.shape[:2]
        mask = _evaluated(attention_masks, batch, seqlen)
        out = F.scaled_dot_product_attention(q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2),
                                             v_BLNH.transpose(1, 2), attn_mask=mask, scale=scale)
        return out.transpose(1, 2)


def _loss_and_grads(model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor,
                    masks: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logits = model(tokens, positions=positions, attention_masks=masks)
    logits.float().square().mean().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


# -- the model, stock vs converted ---------------------------------------------------------------


def test_converted_deepseek_matches_stock_attention_with_the_same_documents(fake_aiter,
                                                                            monkeypatch):
    from torchtitan.models.common.attention import FlexAttention, VarlenMetadata

    from titan_rocm.workarounds.mla_ck_backward.batched_tt030 import MLAVarlenAttention
    from titan_rocm.workarounds.mla_ck_backward.documents import dense_mask

    _flex_eager(monkeypatch)
    config = _deepseek_config()
    stock = _build(config)
    converted = copy.deepcopy(stock)
    positions = _positions()
    tokens = torch.randint(0, 2048, positions.shape, generator=torch.Generator().manual_seed(3))
    with on_rocm("gfx942", fake_aiter):
        decision = _convert(config, converted)
        assert decision.applied and decision.details["replaced"] == {"varlen": 2}
        masks = converted.get_attention_masks(positions)
        ours, our_grads = _loss_and_grads(converted, tokens, positions, masks)

    # TorchTitan's own mask dispatch gives the varlen path TorchTitan's own boundaries.
    assert isinstance(masks, VarlenMetadata) and masks.cu_seq_q.tolist() == CU_SEQLENS
    block_mask = stock.get_attention_masks(positions)
    assert torch.equal(dense_mask(masks.cu_seq_q, 2, SEQLEN), _evaluated(block_mask, 2, SEQLEN))
    # The model's own copy of its config tree switched; the job's config did not.
    assert type(converted.config.first_attention.inner_attention) is MLAVarlenAttention.Config
    assert type(config.model_spec.model.first_attention.inner_attention) is FlexAttention.Config

    with torch.no_grad():
        flex = stock(tokens, positions=positions, attention_masks=block_mask)
    assert_matches(ours, flex, tol=3e-2)
    for block in stock.layers.values():
        block.attention.inner_attention = _SdpaUnderTheMask()
    stock_logits, stock_grads = _loss_and_grads(stock, tokens, positions, block_mask)
    assert_matches(stock_logits, flex, tol=3e-2)
    assert_grads_close(our_grads, stock_grads)
    names = fake_aiter.names()
    assert names.count(FORWARD[fake_aiter.GENERATION]) == 2, names
    assert names.count(varlen_backward_kernel(fake_aiter)) == 2, names
    segments = list(zip(CU_SEQLENS, CU_SEQLENS[1:], strict=False))
    assert all(details["segments"] == segments for _, details in fake_aiter.CALLS)


def test_replacements_keep_the_sharding_argument_names_and_the_stock_fields(fake_aiter):
    """TP shards the inner attention by forward's argument names (q_BLNH, k_BLNH, v_BLNH),
    from the sharding config TorchTitan set on the stock config; the replacement carries it,
    and Flex's block size, into its own config."""
    config = _deepseek_config()
    stock_inner = config.model_spec.model.layers[0].attention.inner_attention
    stock_inner.block_size = 64
    model = _build(config)
    with on_rocm("gfx942", fake_aiter):
        assert _convert(config, model, mla_document_masks="drop").applied
    inner = model.layers["0"].attention.inner_attention
    assert type(inner).__name__ == "MLADroppedMasksAttention"
    sharding = inner._sharding_config
    assert sharding is not None and sharding == stock_inner.sharding_config
    assert inner._cache_pos_arg_names() == ["q_BLNH", "k_BLNH", "v_BLNH"]
    assert set(inner._cache_pos_arg_names()) <= set(sharding.in_dst_shardings)
    assert model.config.layers[0].attention.inner_attention.block_size == 64


def test_compiled_varlen_attention_serves_changing_documents_with_one_graph(fake_aiter):
    """VarlenMetadata's document count and longest document change every batch: Dynamo
    recompiles once (automatic dynamic shapes), then one fullgraph graph serves every layout,
    equal to eager."""
    from torch._dynamo.utils import counters
    from torchtitan.models.common.attention import create_varlen_metadata_for_document

    from titan_rocm.workarounds.mla_ck_backward.batched_tt030 import MLAVarlenAttention

    module = MLAVarlenAttention.Config().build()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(5)
    with on_rocm("gfx942", fake_aiter):
        for starts in (([4, 11], [20]), ([7], [3, 9, 30]), ([2, 3, 30], []), ([10], [10])):
            masks = create_varlen_metadata_for_document(_positions(starts))
            shapes = ((2, SEQLEN, 4, 192), (2, SEQLEN, 4, 192), (2, SEQLEN, 4, 128))
            qkv = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]
            assert_compiled_matches_eager(module, compiled, qkv, attention_masks=masks,
                                          scale=0.1)
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


@pytest.mark.parametrize(("stock", "document_masks", "kind", "inner"), [
    ("flex", "keep", "varlen", "MLAVarlenAttention"),
    ("varlen", "keep", "varlen", "MLAVarlenAttention"),
    ("flex", "drop", "dropped", "MLADroppedMasksAttention"),
    ("sdpa", "keep", "sdpa", "MLASdpaAttention"),
])
def test_each_stock_attention_gets_its_replacement_and_its_masks(fake_aiter, monkeypatch, stock,
                                                                 document_masks, kind, inner):
    """Dense kinds run causal attention across documents: stock SDPA (no masks) computes the
    same; under drop the trainer still builds a BlockMask, which is ignored."""
    from torchtitan.models.common.attention import (
        FlexAttention,
        ScaledDotProductAttention,
        VarlenAttention,
    )

    _flex_eager(monkeypatch)
    config = _deepseek_config()
    configs = {"flex": FlexAttention.Config, "varlen": VarlenAttention.Config,
               "sdpa": ScaledDotProductAttention.Config}
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = configs[stock]()
    model = _build(config)
    positions = _positions()
    tokens = torch.randint(0, 2048, positions.shape, generator=torch.Generator().manual_seed(4))
    with on_rocm("gfx942", fake_aiter):
        decision = _convert(config, model, mla_document_masks=document_masks)
        assert decision.details["replaced"] == {kind: 2}
        assert {type(b.attention.inner_attention).__name__ for b in model.layers.values()} == {
            inner}
        masks = model.get_attention_masks(positions) if stock != "sdpa" else None
        logits = model(tokens, positions=positions, attention_masks=masks)
        again = _convert(config, model, mla_document_masks=document_masks)
    assert again.details["replaced"] == {}  # already replaced: left as it is
    if kind == "varlen":
        return  # against the stock model: the test above
    reference = _build(config)
    for block in reference.layers.values():
        block.attention.inner_attention = ScaledDotProductAttention.Config().build()
    with torch.no_grad():
        causal = reference(tokens, positions=positions)
    assert_matches(logits, causal, tol=3e-2)
    assert fake_aiter.names() == ["mha_fwd", "mha_fwd"]  # 0.1.7 and main: CK on gfx942


def test_gate_keeps_its_reasons_on_0_3_0(fake_aiter):
    """No DeepSeek attention, an attention titan-rocm does not replace, and (per-document
    masks) pipeline parallelism: each skipped with its sentence; CP refused by unmet()."""
    from tt030_harness import causal_sdpa_config

    from titan_rocm.workarounds.base import Parallelism
    from titan_rocm.workarounds.mla_ck_backward.seams_tt030 import PP_REASON

    config = _deepseek_config()
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = causal_sdpa_config()
    with on_rocm("gfx942", fake_aiter):
        decision = _convert(config, _build(config))
        assert decision.reason == (
            "attention runs CausalSdpa; rocm.mla_ck_backward replaces only TorchTitan's "
            "ScaledDotProductAttention, FlexAttention and causal VarlenAttention")
        assert _convert(config, torch.nn.Linear(2, 2)).reason.startswith(
            "model has no DeepSeek V3 MLA attention")
        for pp, cp, masks, reason in ((2, 1, "keep", PP_REASON), (2, 1, "drop", None),
                                      (1, 2, "keep", "context parallelism is on")):
            config = _deepseek_config()
            got = _convert(config, _build(config), Parallelism(world_size=2, pp=pp, cp=cp),
                           mla_document_masks=masks)
            assert got.reason.startswith(reason) if reason else got.applied, (pp, cp, got)


# -- the real trainer ------------------------------------------------------------------------------


@pytest.mark.slow
def test_rocm_trainer_trains_like_stock_attention_with_the_same_documents(cpu_harness,
                                                                          fake_aiter):
    """TorchTitan 0.3.0's own trainer, op SAC (the debug model's SelectiveAC), FSDP mixed
    precision, three documents per sample, three steps: titan-rocm's varlen path through the
    fake, its blocks compiled in place (fullgraph), against stock SDPA under TorchTitan's own
    BlockMask, eager."""
    from torchtitan.models.common.attention import FlexAttention
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel
    from torchtitan.protocols.module import Module

    from titan_rocm.adapters.tt030 import rocm
    from titan_rocm.workarounds.mla_ck_backward.batched_tt030 import MLAVarlenAttention

    class SdpaUnderTheMask(Module, _SdpaUnderTheMask):
        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(FlexAttention.Config):  # the trainer builds its BlockMask
            pass

        def __init__(self, config: Any) -> None:
            super().__init__()

    starts = (37, 90)
    stock = cpu_harness.config(deepseek_v3_debugmodel(), steps=3, document_starts=starts)
    for layer in stock.model_spec.model.layers:
        layer.attention.inner_attention = SdpaUnderTheMask.Config()
    stock_run = cpu_harness.train(stock)

    ours = cpu_harness.config(deepseek_v3_debugmodel(), steps=3, document_starts=starts,
                              compile=True)
    for layer in ours.model_spec.model.layers:
        layer.attention.inner_attention = FlexAttention.Config()
    with on_rocm("gfx942", fake_aiter):
        run = cpu_harness.train(rocm(ours, **ONLY_MLA))
    decision = next(d for d in run.trainer._rocm.decisions if d.workaround == "mla_ck_backward")
    assert decision.applied and decision.details["replaced"] == {"varlen": 2}
    model = run.trainer.model_parts[0]
    assert sum(type(m) is MLAVarlenAttention for m in model.modules()) == 2
    assert all(block._compiled_call_impl is not None for block in model.layers.values())
    assert run.steps == stock_run.steps == [1, 2, 3]
    # Same attention differs here by < 4e-5; ignoring the documents within a sample moves the
    # losses or gradient norms by 5e-4 and more.
    for got, want in zip(run.losses + run.grad_norms, stock_run.losses + stock_run.grad_norms,
                         strict=True):
        assert math.isclose(got, want, rel_tol=2e-4), (run.losses, stock_run.losses)
    names = fake_aiter.names()
    # Op SAC saved the forward: one per layer and step, not recomputed in the backward.
    assert names.count(FORWARD[fake_aiter.GENERATION]) == 6, names
    assert names.count(varlen_backward_kernel(fake_aiter)) == 6, names
    segments = [(0, 37), (37, 90), (90, 128), (128, 165), (165, 218), (218, 256)]
    assert all(details["segments"] == segments for _, details in fake_aiter.CALLS)


# -- the plan --------------------------------------------------------------------------------------

PLAN_KEYS = ["arch", "aiter", "attention", "shape", "forward", "forward_runs", "forward_reason",
             "backward", "backward_runs", "backward_reason", "modules", "dtype", "document_masks",
             "replaced", "op_sac_save_list", "guard", "guard_not_covered"]
"""The plan's MLA details, in 0.2.2's order (docs/mla-ck-backward.md shows them)."""


CK_BACKWARD = "ck (mha_varlen_bwd)"
FLYDSL_BACKWARD = "aiter (_flash_attn_varlen_backward)"
"""aiter main with ROCm/aiter#4875 runs the varlen backward on its FlyDSL kernel (gfx942)."""


@pytest.mark.parametrize(("aiter", "forward_runs", "backward"), [
    ("0.1.7", "CK mha_varlen_fwd", CK_BACKWARD),
    ("e4048607", "fmha_v3_varlen_fwd (ASM)", CK_BACKWARD),
    ("main", "fmha_v3_varlen_fwd (ASM)", FLYDSL_BACKWARD)])
def test_plan_of_deepseek_16b_shows_mla_applied_varlen_with_its_routes(capsys, aiter,
                                                                       forward_runs, backward):
    import json

    from titan_rocm.cli import main

    assert main(["plan", "--module", "titan_rocm.torchtitan.configs", "--config",
                 "deepseek_v3_16b", "--arch", "gfx942", "--aiter", aiter, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    decision = next(d for d in plan["workarounds"] if d["workaround"] == "mla_ck_backward")
    details = decision["details"]
    assert decision["applied"] and list(details) == PLAN_KEYS
    assert details["attention"].startswith("varlen (block_causal mask)")
    assert (details["modules"], details["replaced"], details["dtype"]) == (27, {"varlen": 27},
                                                                           "bfloat16")
    assert (details["forward_runs"], details["backward"]) == (forward_runs, backward)
    assert details["op_sac_save_list"].startswith(
        "torchtitan.distributed.activation_checkpoint._get_default_save_ops")
    assert "VarlenMetadata" in details["document_masks"]


def test_plan_refuses_aiter_without_arch_with_exit_2(capsys):
    from titan_rocm.cli import main

    assert main(["plan", "--module", "titan_rocm.torchtitan.configs", "--config",
                 "deepseek_v3_16b", "--aiter", "main"]) == 2
    assert "--aiter main describes a simulated machine; give --arch too" in (
        capsys.readouterr().err)
