"""The audit names each shipped workaround on the blocks its class declares it shapes
(``Workaround.audit_shapes``), in apply order."""

from __future__ import annotations

import torch
import torch.nn as nn

from titan_rocm.numerics.attribution import JobFacts, segments
from titan_rocm.workarounds.registry import workaround_classes


def test_the_shipped_workarounds_are_attributed_where_they_act():
    classes = workaround_classes()
    shapes = {name: cls.audit_shapes for name, cls in classes.items() if cls.audit_shapes}
    facts = JobFacts(list(classes), [], shapes, {"moe_eager_compile": {"1": "eager"}})
    moe = nn.Linear(2, 2)
    moe.moe_enabled = True
    model = nn.Module()
    model.layers = nn.ModuleDict({"0": torch.compile(nn.Linear(2, 2)), "1": moe})
    blocks = {s.name: s.workarounds for s in segments([model], facts)}
    assert blocks["0"] == ["precision_casts", "triton_war", "gemm_lookup", "mla_ck_backward"]
    assert blocks["1"] == ["grouped_mm", "moe_eager_compile (eager)", "mla_ck_backward"]
    assert blocks["embedding"] == blocks["head"] == []
