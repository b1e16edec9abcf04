"""MLA under per-document (block_causal) masks: DocumentSpans from TorchTitan's own document
boundaries, aiter's varlen attention through the fake aiter (both generations), checked per
document against TorchTitan's mask (FlexAttention for the output, SDPA under the same mask
for the gradients: FlexAttention has no CPU backward), and the converted TorchTitan model
against the stock one.

Boundary layouts (TorchTitan: a document ends with, and includes, its EOS token; each sample's
end closes a document): one document, many, one crossing the sample boundary in the packed
stream (split there), EOS at the first and at the last position, batch > 1.
"""

from __future__ import annotations

import copy
import functools
import logging
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.support.mla_test_support import (
    assert_compiled_matches_eager,
    assert_matches,
    on_rocm,
    varlen_backward_kernel,
)
from tests.support.moe_test_models import convert, decisions, model_args, parse, world_of_one
from titan_rocm import platform
from titan_rocm.platform import PlatformFacts
from titan_rocm.workarounds.mla_ck_backward import documents, op
from titan_rocm.workarounds.mla_ck_backward.documents import DocumentSpans, document_spans
from titan_rocm.workarounds.mla_ck_backward.module import MLAVarlenInnerAttention

pytestmark = pytest.mark.usefixtures("clean_mla_state")

EOS = 1
SEQLEN = 32
# name -> (EOS positions per sample, the cu_seqlens TorchTitan's boundaries give)
LAYOUTS = {
    "one_document": ([[]], [0, 32]),
    "many_documents": ([[4, 11, 19, 23]], [0, 5, 12, 20, 24, 32]),
    "crossing_samples": ([[10], [6]], [0, 11, 32, 39, 64]),
    "eos_first_and_last": ([[0, 31]], [0, 1, 32]),
    "batch_of_three": ([[], [15, 31], [2, 3, 30]], [0, 32, 48, 64, 67, 68, 95, 96]),
}
# The varlen MLA forward's kernel per API generation and arch (the backward's:
# varlen_backward_kernel, which tells the two mains apart).
VARLEN_FORWARD = {
    ("0.1.7", "gfx942"): "mha_varlen_fwd",
    ("main", "gfx942"): "fmha_v3_varlen_fwd",
    ("0.1.7", "gfx950"): "fmha_v3_varlen_fwd",
    ("main", "gfx950"): "fmha_v3_varlen_fwd",
}


def _tokens(eos_positions: list[list[int]], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, 100, (len(eos_positions), SEQLEN), generator=gen)
    for b, positions in enumerate(eos_positions):
        tokens[b, positions] = EOS
    return tokens


def torchtitan_mask(tokens: torch.Tensor) -> torch.Tensor:
    """(batch, 1, seqlen, seqlen): TorchTitan 0.2.2's own block_causal mask_mod, evaluated."""
    from torch.nn.attention.flex_attention import and_masks
    from torchtitan.models.attention import get_causal_mask_mod, get_document_mask_mod

    mask_mod = and_masks(get_causal_mask_mod(), get_document_mask_mod(tokens, EOS))
    batch, seqlen = tokens.shape
    b = torch.arange(batch)[:, None, None]
    i = torch.arange(seqlen)[None, :, None]
    j = torch.arange(seqlen)[None, None, :]
    return mask_mod(b, torch.zeros(()), i, j)[:, None]


def _bhsd(batch, heads=4, qk=192, v=128, seed=0, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, heads, SEQLEN, qk), (batch, heads, SEQLEN, qk), (batch, heads, SEQLEN, v))
    return [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]


def _sdpa_reference(q, k, v, mask, scale, dout):
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale)
    out.backward(dout.float())
    return out.detach(), qf.grad, kf.grad, vf.grad


# -- the document boundaries -------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_spans_are_torchtitans_document_boundaries(layout):
    eos, expected = LAYOUTS[layout]
    tokens = _tokens(eos)
    spans = document_spans(tokens, EOS)
    assert spans.cu_seqlens.tolist() == expected
    assert spans.cu_seqlens.dtype == torch.int32
    assert spans.max_seqlen == max(b - a for a, b in zip(expected, expected[1:], strict=False))
    assert (spans.batch, spans.seqlen) == (len(eos), SEQLEN)
    assert torch.equal(spans.dense_mask(), torchtitan_mask(tokens))


def test_spans_pass_where_deepseek_expects_a_block_mask_and_say_what_they_are():
    from torch.nn.attention.flex_attention import BlockMask

    spans = document_spans(_tokens([[4, 11]]), EOS)
    assert isinstance(spans, BlockMask)  # DeepSeek's Attention.forward asserts this
    assert repr(spans) == "DocumentSpans(batch=1, seqlen=32, documents=3, max_seqlen=20)"


def test_bad_cu_seqlens_name_the_shape_and_what_is_accepted():
    with pytest.raises(ValueError, match=r"cu_seqlens of shape \(1,\) is not valid"):
        DocumentSpans.of(torch.zeros(1, dtype=torch.int32), 1, 1, 1)


def test_get_attention_masks_needs_an_eos_id():
    with pytest.raises(ValueError, match="needs the tokenizer's eos_id"):
        documents.get_attention_masks(_tokens([[3]]), SimpleNamespace(eos_id=None))
    spans = documents.get_attention_masks(_tokens([[3]]), SimpleNamespace(eos_id=EOS))
    assert spans.cu_seqlens.tolist() == [0, 4, 32]


def test_install_is_idempotent_and_survives_a_deepcopy():
    model = torch.nn.Module()
    model.get_attention_masks = lambda *a, **k: None
    assert documents.install(model) and not documents.install(model)
    assert documents.installed(copy.deepcopy(model))  # PP stages and EMA copies keep it


# -- the varlen module against TorchTitan's mask ------------------------------------------------


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_varlen_module_matches_torchtitans_document_mask(fake_aiter, layout, arch):
    from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention
    from torchtitan.models.attention import get_causal_mask_mod, get_document_mask_mod

    eos, expected = LAYOUTS[layout]
    tokens = _tokens(eos)
    spans = document_spans(tokens, EOS)
    q, k, v = _bhsd(len(eos))
    module = MLAVarlenInnerAttention()
    with on_rocm(arch, fake_aiter):
        out = module(q, k, v, block_mask=spans, scale=0.1)
        dout = torch.randn_like(out)
        out.backward(dout)
    mask = torchtitan_mask(tokens)
    ref, dq, dk, dv = _sdpa_reference(q, k, v, mask, 0.1, dout)
    assert_matches(out, ref)
    assert_matches(q.grad, dq)
    assert_matches(k.grad, dk)
    assert_matches(v.grad, dv)
    block_mask = create_block_mask(
        and_masks(get_causal_mask_mod(), get_document_mask_mod(tokens, EOS)),
        len(eos), None, SEQLEN, SEQLEN, device="cpu",
    )
    flex = flex_attention(*(t.detach().float() for t in (q, k, v)), block_mask=block_mask,
                          scale=0.1)
    assert_matches(out, flex)
    assert fake_aiter.names() == [VARLEN_FORWARD[(fake_aiter.GENERATION, arch)],
                                  varlen_backward_kernel(fake_aiter, arch)]
    segments = [(a, b) for a, b in zip(expected, expected[1:], strict=False)]
    assert all(details["segments"] == segments for _, details in fake_aiter.CALLS)
    assert fake_aiter.CALLS[-1][1]["v_shape"][-1] == 128  # v never padded


def test_misdetected_arch_routes_the_varlen_forward_by_the_device(fake_aiter, monkeypatch):
    """0.1.7 alone sends q/k 192 to fmha_v3_varlen_fwd when get_gfx() says gfx950: gfx942 has
    no such kernel in that release. main has one; both routed runs succeed."""
    monkeypatch.setenv("GPU_ARCHS", "gfx942;gfx950")
    mha = sys.modules["aiter.ops.mha"]
    spans = document_spans(_tokens([[4, 11]]), EOS)
    q, k, v = _bhsd(1)
    packed = [t.detach().transpose(1, 2).reshape(SEQLEN, 4, -1) for t in (q, k, v)]
    with on_rocm("gfx942", fake_aiter):
        call = lambda: mha._flash_attn_varlen_forward(  # noqa: E731
            *packed, spans.cu_seqlens, spans.cu_seqlens, None, None, 20, 20, 0, 0.0, 0.1, True,
            return_lse=True)
        if fake_aiter.GENERATION == "0.1.7":
            with pytest.raises(RuntimeError, match="invalid argument for fmha_v3_varlen_fwd 3"):
                call()
        else:
            call()
        fake_aiter.reset("gfx942")
        MLAVarlenInnerAttention()(q, k, v, block_mask=spans, scale=0.1).sum().backward()
    forward = {"0.1.7": "mha_varlen_fwd", "main": "fmha_v3_varlen_fwd"}[fake_aiter.GENERATION]
    assert fake_aiter.names() == [forward, "mha_varlen_bwd"]


def test_opcheck_varlen_schema_fake_and_autograd(fake_aiter):
    spans = document_spans(_tokens([[4, 11]]), EOS)
    q, k, v = (t.detach().transpose(1, 2).reshape(SEQLEN, 4, -1).requires_grad_()
               for t in _bhsd(1))
    cu = spans.cu_seqlens
    with on_rocm("gfx942", fake_aiter):
        torch.library.opcheck(op.VARLEN_FORWARD_OP, (q, k, v, cu, cu, 20, 20, 0.0, 0.1, True,
                                                    False))
        with torch.no_grad():
            out, lse, rng = op.VARLEN_FORWARD_OP(q, k, v, cu, cu, 20, 20, 0.0, 0.1, True, False)
        assert lse.shape == (4, SEQLEN)
        q, k, v = (t.detach() for t in (q, k, v))
        torch.library.opcheck(op.VARLEN_BACKWARD_OP, (torch.randn_like(out), q, k, v, out, lse,
                                                     rng, cu, cu, 20, 20, 0.0, 0.1, True, False))


def test_torch_compile_fullgraph_matches_eager_across_batches(fake_aiter):
    """The number of documents and the longest one change every batch: Dynamo recompiles once
    (automatic dynamic shapes), then one graph serves every layout."""
    from torch._dynamo.utils import counters

    module = MLAVarlenInnerAttention()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    layouts = [[[4, 11, 19]], [[7]], [[2, 3, 30]], [[10, 20]]]
    with on_rocm("gfx942", fake_aiter):
        for eos in layouts:
            spans = document_spans(_tokens(eos), EOS)
            assert_compiled_matches_eager(module, compiled, _bhsd(1, seed=len(eos)),
                                          block_mask=spans, scale=0.1)
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    # The compiled backward too hands aiter one cu_seqlens tensor for q and k, which #4875's
    # gate asks for (by data_ptr): the newest main reaches its FlyDSL kernel every time.
    backwards = {name for name in fake_aiter.names() if name.endswith("_bwd")}
    assert backwards == {varlen_backward_kernel(fake_aiter)}


def test_split_v_reaches_the_backward_the_route_names_with_its_own_layout(fake_aiter):
    """DeepSeek's v is a slice of the kv projection: not contiguous, though its last stride is 1,
    which aiter leaves as it is. titan-rocm hands aiter contiguous tensors where the route asks
    (#4875's gate reads is_contiguous), so the newest main reaches its FlyDSL kernel; the
    gradients keep the inputs' layouts and match attention within each document."""
    gen = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 12, 32], dtype=torch.int32)
    q = torch.randn(SEQLEN, 4, 192, generator=gen).to(torch.bfloat16).requires_grad_()
    k = torch.randn(SEQLEN, 4, 192, generator=gen).to(torch.bfloat16).requires_grad_()
    kv = torch.randn(SEQLEN, 4, 256, generator=gen).to(torch.bfloat16).requires_grad_()
    v = kv.split([128, 128], dim=-1)[1]
    assert not v.is_contiguous() and v.stride(-1) == 1
    with on_rocm("gfx942", fake_aiter):
        out = op.mla_varlen_attention(q, k, v, cu, 20, softmax_scale=0.1)
        dout = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
        out.backward(dout)
    assert fake_aiter.names()[-1] == varlen_backward_kernel(fake_aiter)
    mask = documents.dense_mask(cu, 1, SEQLEN)
    ref, dq, dk, dv = _sdpa_reference(*(t[None].transpose(1, 2) for t in (q, k, v)), mask, 0.1,
                                      dout[None].transpose(1, 2))
    assert_matches(out, ref[0].transpose(0, 1))
    for got, want in ((q.grad, dq), (k.grad, dk), (kv.grad[..., 128:], dv)):
        assert_matches(got, want[0].transpose(0, 1))
    assert q.grad.stride() == q.stride()


@pytest.mark.parametrize(("save", "forward_calls"), [(True, 1), (False, 2)])
def test_op_sac_saves_the_varlen_forward(fake_aiter, save, forward_calls):
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import _apply_op_sac

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner_attention = MLAVarlenInnerAttention()

        def forward(self, q, k, v, spans):
            return self.inner_attention(q * 1.0, k, v, block_mask=spans, scale=0.1)

    save_list = {op.VARLEN_FORWARD_OP} if save else set()
    block = _apply_op_sac(Block(), ActivationCheckpoint(), op_sac_save_list=save_list)
    spans = document_spans(_tokens([[4, 11]]), EOS)
    with on_rocm("gfx942", fake_aiter):
        block(*_bhsd(1), spans).sum().backward()
    forward = {"0.1.7": "mha_varlen_fwd", "main": "fmha_v3_varlen_fwd"}[fake_aiter.GENERATION]
    assert fake_aiter.names().count(forward) == forward_calls
    assert fake_aiter.names().count(varlen_backward_kernel(fake_aiter)) == 1


def test_fallbacks_keep_the_documents(fake_aiter, caplog, monkeypatch):
    """float32 runs SDPA under the per-document mask; a plain BlockMask (what PP's microbatch
    split makes) runs TorchTitan's flex attention with it (here uncompiled). Each logged once."""
    from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention
    from torchtitan.models.attention import (
        FlexAttentionWrapper,
        get_causal_mask_mod,
        get_document_mask_mod,
    )

    monkeypatch.setattr(FlexAttentionWrapper, "_compiled_flex_attn", flex_attention)

    tokens = _tokens([[4, 11]])
    spans = document_spans(tokens, EOS)
    module = MLAVarlenInnerAttention()
    q, k, v = (t.detach() for t in _bhsd(1, dtype=torch.float32))
    with on_rocm("gfx942", fake_aiter), caplog.at_level(logging.WARNING, logger="titan_rocm"):
        out = module(q, k, v, block_mask=spans, scale=0.1)
        module(q, k, v, block_mask=spans, scale=0.1)
        block_mask = create_block_mask(
            and_masks(get_causal_mask_mod(), get_document_mask_mod(tokens, EOS)), 1, None,
            SEQLEN, SEQLEN, device="cpu")
        flex_attn = module(q, k, v, block_mask=block_mask, scale=0.1)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=torchtitan_mask(tokens),
                                               scale=0.1)
    torch.testing.assert_close(out, reference)
    torch.testing.assert_close(flex_attn, reference, atol=1e-5, rtol=1e-5)
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("SDPA with the per-document mask" in w for w in warnings) == 1
    assert sum("not titan-rocm's DocumentSpans" in w for w in warnings) == 1
    assert fake_aiter.names() == []


# -- TorchTitan's DeepSeek model, stock vs converted ---------------------------------------------


class _SdpaUnderTheBlockMask(torch.nn.Module):
    """The stock model's reference attention: TorchTitan's BlockMask, its own mask_mod
    evaluated densely, SDPA (FlexAttention has no CPU backward)."""

    def forward(self, q, k, v, *, score_mod=None, block_mask=None, scale=None, return_lse=False,
                enable_gqa=False):
        batch, _, seqlen, _ = q.shape
        b = torch.arange(batch)[:, None, None]
        i = torch.arange(seqlen)[None, :, None]
        j = torch.arange(seqlen)[None, None, :]
        mask = block_mask.mask_mod(b, torch.zeros(()), i, j)[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _two_dense_blocks(job):
    """The flex/block_causal debug model cut to two dense blocks (0.2.2's MoE routing calls
    torch.histc on int64, which has no CPU kernel), bf16 as FSDP's mixed precision computes."""
    from torchtitan.protocols.train_spec import get_train_spec

    args = model_args(job)
    args.n_layers = args.n_dense_layers = 2
    with torch.device("meta"):
        model = get_train_spec("deepseek_v3").model_cls(args)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
    return model


def _plain(name: str) -> str:
    """A parameter's name without compile's and checkpointing's wrapper levels."""
    for wrapper in ("._orig_mod", "._checkpoint_wrapped_module"):
        name = name.replace(wrapper, "")
    return name


def test_converted_model_matches_stock_block_causal_model(fake_aiter, monkeypatch):
    """Same weights, same tokens (documents crossing samples, batch 2): the converted model
    (aiter varlen through the fake, masks from its get_attention_masks) against TorchTitan's
    own model and BlockMask; then TorchTitan's parallelize_fn (op SAC + compile) on it."""
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.deepseek_v3.model import model as deepseek_model
    from torchtitan.protocols.train_spec import get_train_spec

    # Eager, on the CPU: create_block_mask's default device is torch.accelerator's current one
    # (torch 2.13.0 nn/attention/flex_attention.py:1895, 2.15.0:2049), CUDA on a CUDA wheel.
    monkeypatch.setattr(deepseek_model, "create_attention_mask",
                        functools.partial(create_block_mask, device="cpu"))
    job = parse("--model.name", "deepseek_v3", "--model.flavor", "debugmodel_flex_attn",
                "--model.converters", "rocm.mla_ck_backward",
                "--activation_checkpoint.mode", "selective",
                "--activation_checkpoint.selective_ac_option", "op",
                "--compile.enable", "--compile.backend", "aot_eager")
    stock = _two_dense_blocks(job)
    converted = copy.deepcopy(stock)
    for block in stock.layers.values():
        block.attention.inner_attention = _SdpaUnderTheBlockMask()
    tokenizer = SimpleNamespace(eos_id=EOS)
    tokens = _tokens([[5, 17], [9]], seed=3)
    with on_rocm("gfx942", fake_aiter):
        assert decisions(convert(job, converted))["mla_ck_backward"].applied
        converted = get_train_spec("deepseek_v3").parallelize_fn(converted, world_of_one(), job)
        results = []
        for model in (stock, converted):
            masks = model.get_attention_masks(tokens, tokenizer)
            logits = model(tokens, attention_masks=masks)
            logits.float().square().mean().backward()
            results.append((logits.detach(), {_plain(n): p.grad
                                              for n, p in model.named_parameters()}))
    (stock_logits, stock_grads), (our_logits, our_grads) = results
    assert isinstance(masks, DocumentSpans)
    assert_matches(our_logits, stock_logits, tol=3e-2)
    assert set(our_grads) == set(stock_grads)
    for name, grad in stock_grads.items():
        rel = (our_grads[name].float() - grad.float()).norm() / grad.float().norm()
        assert rel < 5e-2, (name, float(rel))
    forward = {"0.1.7": "mha_varlen_fwd", "main": "fmha_v3_varlen_fwd"}[fake_aiter.GENERATION]
    names = fake_aiter.names()
    backward = varlen_backward_kernel(fake_aiter)
    assert names.count(forward) == 2 and names.count(backward) == 2, names  # SAC saved


@pytest.mark.parametrize(("aiter", "backward", "backward_runs"), [
    ("e4048607", "ck (mha_varlen_bwd)", "CK mha_varlen_bwd"),
    ("main", "aiter (_flash_attn_varlen_backward)", "flydsl_flash_attn_varlen_bwd (FlyDSL)"),
])
def test_plan_of_the_16b_flavor_shows_varlen_routes(aiter, backward, backward_runs):
    """TorchTitan 0.2.2's 16B flavor (flex, block_causal) on simulated gfx942: converted; aiter
    main with #4875 runs the varlen backward on its FlyDSL kernel, main at e4048607 on CK."""
    from tests.support.moe_test_models import build_meta

    job = parse("--model.name", "deepseek_v3", "--model.flavor", "16B",
                "--model.converters", "rocm.mla_ck_backward")
    model = build_meta(job)
    with platform.override(PlatformFacts.simulated_rocm("gfx942", aiter=aiter)):
        decision = decisions(convert(job, model))["mla_ck_backward"]
    details = decision.details
    assert decision.applied and details["modules"] == 27
    assert (details["forward_runs"], details["backward"], details["backward_runs"]) == (
        "fmha_v3_varlen_fwd (ASM)", backward, backward_runs)
