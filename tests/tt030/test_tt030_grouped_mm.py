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
    from titan_rocm.workarounds.grouped_mm import tt030
    from titan_rocm.workarounds.grouped_mm.backends import CALLS

    module = _experts(cls_name)
    x, counts = _inputs()
    stock = module(x, counts)
    holder = nn.ModuleDict({"experts": module})
    assert tt030.bind(holder, "loop") == {"experts": seam}
    assert type(module).__name__ == f"Rocm{cls_name}"
    before = CALLS["loop"]
    ours = module(x, counts)
    assert CALLS["loop"] == before + 1
    used = int(counts.sum())
    # Stock runs the GEMMs in BF16, loop in x's dtype (float32 here).
    torch.testing.assert_close(ours[:used], stock[:used].to(ours.dtype), rtol=3e-2, atol=3e-2)
    assert tt030.layer_backends(holder)["experts"].startswith("loop")


def test_torch_backend_counts_and_keeps_the_class_math_exactly():
    from titan_rocm.workarounds.grouped_mm import tt030

    module = _experts("GptOssGroupedExperts")
    x, counts = _inputs()
    stock = module(x, counts)
    tt030.bind(nn.ModuleDict({"e": module}), "torch")
    used = int(counts.sum())  # torch._grouped_mm leaves the padding rows unwritten
    assert torch.equal(module(x, counts)[:used], stock[:used])


def test_a_class_with_its_own_grouped_mm_is_left_stock_for_another_backend():
    """TorchTitan's MXFP8 experts override ``_grouped_mm``: a loop binding would bypass it."""
    from torchtitan.models.common.moe import GroupedExperts

    from titan_rocm.workarounds.grouped_mm import tt030

    class QuantizedExperts(GroupedExperts):
        def _grouped_mm(self, *, A, B_t, offs):
            return super()._grouped_mm(A=A, B_t=B_t, offs=offs)

    module = QuantizedExperts(GroupedExperts.Config(dim=8, hidden_dim=8, num_experts=2))
    done = tt030.bind(nn.ModuleDict({"e": module}), "loop")
    assert done["e"].startswith("not covered")
    assert type(module) is QuantizedExperts
    assert tt030.bind(nn.ModuleDict({"e": module}), "torch") == {"e": "counted"}


def test_binding_again_rebinds_without_stacking_subclasses():
    from titan_rocm.workarounds.grouped_mm import tt030

    module = _experts()
    holder = nn.ModuleDict({"e": module})
    tt030.bind(holder, "loop")
    tt030.bind(holder, "torch")
    assert type(module).__mro__[1].__name__ == "GroupedExperts"
    assert tt030.bound_backend(module) == "torch"
