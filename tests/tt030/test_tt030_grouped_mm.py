"""The grouped-MM binding's 0.3.0 seam on TorchTitan's own experts modules (eager, CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn


def _experts(cls_name: str = "GroupedExperts"):
    from torchtitan.models.common.moe import GroupedExperts
    from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts

    cls = {"GroupedExperts": GroupedExperts, "GptOssGroupedExperts": GptOssGroupedExperts}[
        cls_name
    ]
    torch.manual_seed(0)
    module = cls.Config(dim=16, hidden_dim=24, num_experts=4).build()
    for p in module.parameters():
        nn.init.normal_(p, std=0.1)
    return module


def _inputs():
    counts = torch.tensor([5, 0, 7, 3])
    x = torch.randn(int(counts.sum()) + 2, 16)  # 2 padding rows, as TorchTitan adds
    return x, counts


@pytest.mark.parametrize("cls_name, seam", [("GroupedExperts", "forward"),
                                            ("GptOssGroupedExperts", "_grouped_mm")])
def test_loop_backend_matches_the_stock_experts_on_the_routed_rows(cls_name, seam):
    from titan_rocm.workarounds.grouped_mm import seams_tt030
    from titan_rocm.workarounds.grouped_mm.backends import CALLS

    module = _experts(cls_name)
    x, counts = _inputs()
    stock = module(x, counts)
    holder = nn.ModuleDict({"experts": module})
    assert seams_tt030.bind(holder, "loop") == {"experts": seam}
    assert type(module).__name__ == f"Rocm{cls_name}"
    before = CALLS["loop"]
    ours = module(x, counts)
    assert CALLS["loop"] == before + 1
    used = int(counts.sum())
    # Stock runs the GEMMs in BF16, loop in x's dtype (float32 here).
    torch.testing.assert_close(ours[:used], stock[:used].to(ours.dtype), rtol=3e-2, atol=3e-2)
    assert seams_tt030.layer_backends(holder)["experts"].startswith("loop")


def test_torch_backend_counts_and_keeps_the_class_math_exactly():
    from titan_rocm.workarounds.grouped_mm import seams_tt030

    module = _experts("GptOssGroupedExperts")
    x, counts = _inputs()
    stock = module(x, counts)
    seams_tt030.bind(nn.ModuleDict({"e": module}), "torch")
    used = int(counts.sum())  # torch._grouped_mm leaves the padding rows unwritten
    assert torch.equal(module(x, counts)[:used], stock[:used])


def test_a_class_with_its_own_grouped_mm_is_left_stock_for_another_backend():
    """TorchTitan's MXFP8 experts override ``_grouped_mm``: a loop binding would bypass it."""
    from torchtitan.models.common.moe import GroupedExperts

    from titan_rocm.workarounds.grouped_mm import seams_tt030

    class QuantizedExperts(GroupedExperts):
        def _grouped_mm(self, *, A, B_t, offs):
            return super()._grouped_mm(A=A, B_t=B_t, offs=offs)

    module = QuantizedExperts(GroupedExperts.Config(dim=8, hidden_dim=8, num_experts=2))
    done = seams_tt030.bind(nn.ModuleDict({"e": module}), "loop")
    assert done["e"].startswith("not covered")
    assert type(module) is QuantizedExperts
    assert seams_tt030.bind(nn.ModuleDict({"e": module}), "torch") == {"e": "counted"}


def test_binding_again_rebinds_without_stacking_subclasses():
    from titan_rocm.workarounds.grouped_mm import seams_tt030

    module = _experts()
    holder = nn.ModuleDict({"e": module})
    seams_tt030.bind(holder, "loop")
    seams_tt030.bind(holder, "torch")
    assert type(module).__mro__[1].__name__ == "GroupedExperts"
    assert seams_tt030.bound_backend(module) == "torch"


# -- the FP8 route (issue 22 item 5) on 0.3.0 ---------------------------------------------------


def _float8_experts_class():
    """A stand-in for the class TorchTitan 0.3.0's Float8 grouped-experts converter builds
    (``components/quantization/float8.py``, ``_get_float8_grouped_experts_cls``): a subclass
    named ``Float8<cls>`` with its own Config, whose ``__init__`` wraps the weights as torchao's
    ``quantize_`` does (here with tests/support/fake_torchao.py; torchao is not installed)."""
    from dataclasses import dataclass

    from torchtitan.models.common.moe import GroupedExperts

    from tests.support import fake_torchao

    class Float8GroupedExperts(GroupedExperts):
        @dataclass(kw_only=True, slots=True)
        class Config(GroupedExperts.Config):
            pass

        def __init__(self, config):
            super().__init__(config)
            fake_torchao.quantize_experts(self, ("w1_EFD", "w2_EDF", "w3_EFD"))

    return Float8GroupedExperts


def test_float8_experts_are_named_as_on_022_and_take_the_fp8_route(monkeypatch):
    from tests.support import fake_primus_turbo
    from titan_rocm import platform
    from titan_rocm.adapters.tt030.context import quantized_experts
    from titan_rocm.platform import PlatformFacts
    from titan_rocm.settings import RocmSettings
    from titan_rocm.workarounds.base import TORCHTITAN_030, Context
    from titan_rocm.workarounds.grouped_mm.workaround import GroupedMMBinding

    config = _float8_experts_class().Config(dim=16, hidden_dim=24, num_experts=4)
    assert quantized_experts(config) == ("quantize.grouped_mm.float8",)
    for generation, route in (("main", "primus_turbo:fp8"), ("bf16_only", "torch")):
        fake_primus_turbo.install(monkeypatch, generation)
        facts = PlatformFacts.simulated_rocm("gfx942")
        ctx = Context(settings=RocmSettings(), platform=facts, framework=TORCHTITAN_030,
                      converters=quantized_experts(config))
        with platform.override(facts):
            assert GroupedMMBinding(ctx).route == route, generation


def test_fp8_route_runs_the_float8_experts_and_the_torch_route_still_runs_torchao(monkeypatch):
    """TorchTitan 0.3.0's own experts with the converter's (stand-in) weights, bound through
    the class seam: primus_turbo:fp8 runs Primus-Turbo's FP8 GEMMs on plain tensors, torch
    keeps the class's own path through torchao's scaled grouped GEMM; both train the weights."""
    from tests.support import fake_primus_turbo, fake_torchao
    from titan_rocm.workarounds.grouped_mm import seams_tt030
    from titan_rocm.workarounds.grouped_mm.backends import CALLS

    fake_primus_turbo.install(monkeypatch)
    monkeypatch.setattr(fake_torchao, "SCALED_CALLS", [])  # none left for a later test
    torch.manual_seed(0)
    module = _float8_experts_class().Config(dim=16, hidden_dim=24, num_experts=4).build()
    with torch.no_grad():
        for p in module.parameters():
            p._data.normal_(std=0.2)
    module.bfloat16()
    x, counts = _inputs()
    x = x.bfloat16()
    outputs = {}
    for route in ("primus_turbo:fp8", "torch"):
        fake_torchao.SCALED_CALLS.clear()
        fake_primus_turbo.CALLS.clear()
        assert seams_tt030.bind(nn.ModuleDict({"e": module}), route)["e"] in ("forward", "counted")
        module.zero_grad()
        before = CALLS[route]
        out = module(x, counts)
        out[: int(counts.sum())].float().pow(2).sum().backward()
        assert CALLS[route] == before + 1
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
        outputs[route] = (out.detach(), fake_primus_turbo.names(), len(fake_torchao.SCALED_CALLS))
    assert outputs["primus_turbo:fp8"][1:] == (["grouped_gemm_fp8"] * 3, 0)
    assert outputs["torch"][1:] == ([], 3)
    used = int(counts.sum())
    fp8, ref = (outputs[r][0][:used].float() for r in ("primus_turbo:fp8", "torch"))
    assert 0 < (fp8 - ref).norm() / ref.norm() < 0.1


def test_a_torchtitan_without_grouped_experts_builds_its_job_with_grouped_mm_skipped(
        monkeypatch):
    """pytorch/torchtitan #4539 (open at b5bcd76c) drops GroupedExperts: the job context
    still builds (no quantized experts to name), and the moved seam (torchtitan_version, from
    the files) is grouped_mm's one reason."""
    import dataclasses

    import torchtitan.models.common.moe as moe
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel

    from tests.support.mla_test_support import on_rocm
    from titan_rocm import torchtitan_version
    from titan_rocm.adapters.tt030.context import job_context
    from titan_rocm.workarounds.job import JobWorkarounds

    experts = next(s for s in torchtitan_version.UNREAD_SHAPES if s.workaround == "grouped_mm")
    detect = torchtitan_version.detect
    monkeypatch.setattr(torchtitan_version, "detect", lambda *a: dataclasses.replace(
        detect(*a), moved={"grouped_mm": experts.reason}))
    monkeypatch.delattr(moe, "GroupedExperts")
    with on_rocm("gfx942"):
        ctx = job_context(deepseek_v3_debugmodel(), None)
        assert ctx.converters == ()
        assert JobWorkarounds(ctx, ["grouped_mm"]).decide(nn.Module()) == {
            "grouped_mm": experts.reason}
