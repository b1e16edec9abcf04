"""Inside a block on TorchTitan 0.3.0's own trainer (docs/numerics-audit.md#inside-a-block):
a fault at 0.5 % inside one child of a compiled block is named at its block, child and
direction."""

from __future__ import annotations

from typing import Any

import pytest

from tests.tt030.test_tt030_numerics_audit import _audit, _config
from titan_rocm.testing import audit_matrix, corrupt

pytestmark = pytest.mark.torchtitan030

SITES = (audit_matrix.Site("attention", "mm", 0, "the q projection"),
         audit_matrix.Site("feed_forward", "mul", 0, "the SwiGLU multiply"),
         audit_matrix.Site("attention", "mul", 0, "the rotary multiply of q"),
         audit_matrix.Site("attention", "mul", 1, "the rotary multiply of k"),
         audit_matrix.Site("attention_norm", "mul", 0, "the attention norm"),
         audit_matrix.Site("ffn_norm", "mul", 0, "the feed-forward norm"))


def _inside(cpu_harness: Any, site: audit_matrix.Site) -> list[Any]:
    import torch

    corrupt.uninstall()
    torch._dynamo.reset()
    trainer = cpu_harness.build(_config(cpu_harness, "llama3", "float32", layers=3))
    batch = next(iter(trainer.dataloader))
    try:
        audit_matrix.install(trainer.model_parts, site.op, site.index, site.module)
        keys = [k for k, _ in trainer.model_parts[0].layers.named_children()]
        specs = site.specs(audit_matrix.first_middle_last(keys))
        return audit_matrix.run(lambda: _audit(trainer, batch), specs, [0], lambda seed: None)
    finally:
        trainer.close()
        corrupt.uninstall()


@pytest.mark.slow
@pytest.mark.parametrize("site", SITES, ids=lambda s: f"{s.module}-{s.op}{s.index}")
def test_a_fault_inside_a_child_is_named_at_its_block_and_child(cpu_harness: Any,
                                                                  site: Any) -> None:
    outcomes = _inside(cpu_harness, site)
    clean = outcomes[0].result
    assert clean["verdict"] == "ok", clean["notes"]
    assert {t["module"] for t in clean["tensors"] if "module" in t} == {
        "attention", "attention_norm", "feed_forward", "ffn_norm"}, clean["notes"]
    assert len(outcomes) == 1 + 3 * 2
    wrong = [(o.spec, o.hits, o.judged) for o in outcomes if not o.judged["right"]]
    assert wrong == [], wrong


MOE_SITES = ((audit_matrix.Site("moe.router", "gather", 0, "the router's top-k score gather"),
              ("forward",)),
             (audit_matrix.Site("moe.router", "scatter_add", 0,
                                "the gather's backward scatter-add"), ("backward",)),
             (audit_matrix.Site("moe.routed_experts", "_grouped_mm", 0,
                                "the experts' first grouped GEMM"), ("forward", "backward")))


@pytest.mark.slow
@pytest.mark.parametrize("site,graphs", MOE_SITES, ids=lambda s: getattr(s, "op", None))
def test_a_fault_inside_a_moe_block_compiled_whole_is_named_at_the_moe(
        cpu_harness: Any, site: Any, graphs: tuple[str, ...]) -> None:
    """deepseek_v3 with its MoE blocks compiled whole, as stock 0.3.0 compiles them
    (``moe_eager_compile`` off): the router and the experts run inside the block's one graph,
    traced through the MoE's closures; a fault at 0.5 % in the first, middle and last MoE
    block is named ``block k, moe`` in its direction, after a clean audit."""
    import torch

    corrupt.uninstall()
    torch._dynamo.reset()
    trainer = cpu_harness.build(_config(cpu_harness, "deepseek_v3", "float32", layers=4,
                                        moe_eager_compile="off"))
    batch = next(iter(trainer.dataloader))
    try:
        audit_matrix.install(trainer.model_parts, site.op, site.index, site.module)
        outcomes = audit_matrix.run(lambda: _audit(trainer, batch),
                                    site.specs(["1", "2", "3"], graphs=graphs), [0],
                                    lambda seed: None)
    finally:
        trainer.close()
        corrupt.uninstall()
    clean = outcomes[0].result
    assert clean["verdict"] == "ok", clean["notes"]
    assert "moe" in {t.get("module") for t in clean["tensors"]}, clean["notes"]
    assert len(outcomes) == 1 + 3 * len(graphs)
    wrong = [(o.spec, o.hits, o.judged) for o in outcomes if not o.judged["right"]]
    assert wrong == [], wrong
    assert all(o.judged["first_wrong_module"][o.spec["graph"]] == "moe" for o in outcomes[1:])
