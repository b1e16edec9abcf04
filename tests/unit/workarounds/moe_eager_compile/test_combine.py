"""``[rocm] moe_combine``: Primus's weighted-sum combine of MoE outputs against TorchTitan's.

A small TorchTitan 0.2.2 ``MoE`` (8 experts, top 2, one shared expert, sigmoid scores weighted
after the experts as DeepSeek-V3) runs in BF16 with each combine, and in FP32 as the
reference. The BF16 combine's output and gradients must be as close to the FP32 reference as
stock's are, and autograd must keep less for the backward (the FP32 copy is gone). A mixed
compile job with ``moe_combine = "bf16"`` gets the combine on its MoE modules, and the plan
says so.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("torchtitan")
torch = pytest.importorskip("torch")

from torchtitan.models.moe.moe import MoE, MoEArgs  # noqa: E402

from tests.support.moe_test_models import build_meta, convert, cpu_histc, decisions, parse  # noqa: E402
from titan_rocm.workarounds.moe_eager_compile import combine  # noqa: E402

pytestmark = pytest.mark.torchtitan022

DIM, HIDDEN, TOKENS = 64, 128, 96


def _moe(score_before_experts: bool = False) -> MoE:
    torch.manual_seed(0)
    args = MoEArgs(num_experts=8, num_shared_experts=1, top_k=2, score_func="sigmoid",
                   score_before_experts=score_before_experts, use_grouped_mm=False,
                   load_balance_coeff=None)
    moe = MoE(args, dim=DIM, hidden_dim=HIDDEN)
    with torch.no_grad():
        moe.init_weights(0.02, torch.device("cpu"))
    return moe


def _run(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Output, gradients (as FP32) and the bytes autograd kept for the backward."""
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    x = x.clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = moe(x)
    out.float().pow(2).mean().backward()
    grads = {n: p.grad.float() for n, p in moe.named_parameters() if p.grad is not None}
    grads["x"] = x.grad.float()
    return out.float(), grads, sum(saved)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("score_before_experts", [False, True])
def test_bf16_combine_is_as_close_to_fp32_as_stock_and_keeps_less(score_before_experts,
                                                                   monkeypatch):
    cpu_histc(monkeypatch)  # TorchTitan's router counts int64 with histc (GPU only)
    reference = _moe(score_before_experts)
    x = torch.randn(2, TOKENS // 2, DIM)
    ref_out, ref_grads, _ = _run(reference, x)

    stock = copy.deepcopy(reference).to(torch.bfloat16)
    ours = copy.deepcopy(stock)
    assert combine.use_bf16_combine(ours) and combine.has_bf16_combine(ours)
    assert not combine.use_bf16_combine(ours)  # once
    stock_out, stock_grads, stock_saved = _run(stock, x.bfloat16())
    ours_out, ours_grads, ours_saved = _run(ours, x.bfloat16())

    assert ours_out.dtype == stock_out.dtype == torch.float32  # both returned bf16, cast here
    # Measured here: equal to stock's bit for bit (both sum the top_k products in FP32 and
    # round once); each is 5.6e-3 (output) and <= 8.2e-3 (gradients) from FP32. The bound
    # leaves room for another summation order on another build.
    assert _rel(ours_out, stock_out) < 1e-3
    assert _rel(ours_out, ref_out) <= 1.5 * _rel(stock_out, ref_out) + 1e-3
    for name, ref in ref_grads.items():
        assert _rel(ours_grads[name], ref) <= 1.5 * _rel(stock_grads[name], ref) + 1e-3, name
    routed_fp32_bytes = TOKENS * 2 * DIM * 4  # tokens * top_k * dim, FP32
    if score_before_experts:
        assert ours_saved <= stock_saved  # stock sums without an FP32 copy there too
    else:
        # The FP32 copy (tokens*top_k*dim*4 bytes) is replaced by the BF16 outputs (half).
        assert stock_saved - ours_saved >= routed_fp32_bytes // 2


def test_weighted_combine_matches_the_bmm_in_fp32():
    torch.manual_seed(1)
    tokens, top_k = 10, 3
    routed = torch.randn(tokens * top_k, 8, dtype=torch.float64)
    order = torch.randperm(tokens * top_k)
    scores = torch.rand(tokens, top_k, dtype=torch.float64)
    ours = combine.weighted_combine(routed, order, scores, torch.float64)
    unsorted = torch.zeros_like(routed)
    unsorted[order] = routed
    expected = torch.bmm(scores.view(tokens, 1, top_k), unsorted.view(tokens, top_k, 8))
    torch.testing.assert_close(ours, expected.squeeze(1))


@pytest.mark.parametrize("value", ["fp32", "bf16"])
def test_a_mixed_compile_job_gets_the_combine_it_asks_for(value):
    job = parse("--model.name", "deepseek_v3", "--model.flavor", "debugmodel",
                "--compile.enable", "--model.converters", "rocm.moe_eager_compile",
                "--rocm.moe_eager_compile", "on", "--rocm.moe_combine", value)
    model = build_meta(job)
    decision = decisions(convert(job, model))["moe_eager_compile"]
    assert decision.applied, decision.reason
    assert decision.details["combine"].startswith(f"{value}: ")
    moes = [block.moe for block in model.layers.values() if block.moe_enabled]
    assert moes and all(combine.has_bf16_combine(m) is (value == "bf16") for m in moes)
