"""Inside a block (titan_rocm/numerics/submodules.py, docs/numerics-audit.md#inside-a-block):
each compiled block's children compared on their own, named in the report."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.unit.numerics.test_audit import audit_env  # noqa: F401 - the real trainer's fixture
from titan_rocm.numerics import report, submodules
from titan_rocm.numerics.attribution import Segment
from titan_rocm.numerics.result import AuditError, AuditResult
from titan_rocm.numerics.stats import AuditSettings, TensorStats
from titan_rocm.testing import audit_matrix, corrupt


def _t(name: str, kind: str, module: str | None, flagged: bool = False,
       score: float = 0.5) -> TensorStats:
    return TensorStats(name, "1", kind, 10, 1.0, 1.0, 1.0, score, 0.0, 1.0, flagged,
                       "too far" if flagged else None, module)


def _result(tensors: list[TensorStats]) -> AuditResult:
    return AuditResult(1, 64, "float32", "float64", AuditSettings(),
                       [Segment("1", "block", "compiled")], tensors, None, {}, {}, None)


def test_the_first_wrong_child_in_each_directions_order() -> None:
    tensors = [_t("layers.1 output", "output", None, True),
               _t("layers.1.attention_norm output", "output", "attention_norm"),
               _t("layers.1.attention output", "output", "attention", True, 40.0),
               _t("layers.1.attention input grad", "input_grad", "attention", True),
               _t("layers.1.feed_forward output", "output", "feed_forward", True, 90.0),
               _t("layers.1.feed_forward input grad", "input_grad", "feed_forward", True)]
    result = _result(tensors)
    # Forward: attention runs before feed_forward; backward: feed_forward's gradient first.
    assert result.first_wrong_module("forward") == "attention"
    assert result.first_wrong_module("backward") == "feed_forward"
    out = result.to_dict()
    assert out["first_wrong_module"] == {"forward": "attention", "backward": "feed_forward"}
    assert [t.get("module") for t in out["tensors"]][:2] == [None, "attention_norm"]
    assert "module" not in out["tensors"][0]  # a block's own tensor keeps its old keys
    lines = report.format_report(out).splitlines()
    # The worst tensor of the named child, not the block's worst (feed_forward, 90).
    assert lines[1] == ("  first wrong in the forward: block 1, attention: layers.1.attention "
                        "output: too far")
    assert lines[2].startswith("  first wrong in the backward: block 1, feed_forward: ")


def test_a_block_flagged_only_as_a_whole_names_no_child() -> None:
    result = _result([_t("layers.1 output", "output", None, True),
                      _t("layers.1.attention output", "output", "attention")])
    assert result.first_wrong_module("forward") is None
    assert "first wrong in the forward: block 1: layers.1 output" in report.format_report(
        result.to_dict())


def _uncompiled_record(key: str) -> Any:
    block = torch.nn.Sequential(torch.nn.Linear(2, 2))
    return SimpleNamespace(key=key, module=block)


def test_auto_compares_a_block_it_cannot_probe_as_a_whole_and_says_why_once() -> None:
    inside = submodules.Inside("auto")
    for key in ("0", "1"):
        assert inside.calls(_uncompiled_record(key), 1) == {}
    assert inside.notes() == ["blocks 0, 1 compared as a whole, not child by child: nothing "
                              "in it is compiled (the block-level replay covers its eager "
                              "code)"]


def test_on_makes_a_block_it_cannot_probe_an_audit_error() -> None:
    with pytest.raises(AuditError, match="numerics_audit_submodules = 'on', but block 3 "
                                         "cannot be looked inside: nothing in it is compiled"):
        submodules.Inside("on").calls(_uncompiled_record("3"), 1)


def test_the_setting_takes_the_gating_vocabulary_only() -> None:
    from titan_rocm.settings import RocmSettings

    assert RocmSettings().numerics_audit_submodules == "auto"
    with pytest.raises(ValueError, match="numerics_audit_submodules = 'yes'.*auto.*on.*off"):
        RocmSettings(numerics_audit_submodules="yes")


def _node(path: str, key: str = "nn_module_stack") -> Any:
    return SimpleNamespace(meta={key: {"id": (path, torch.nn.Module)}})


@pytest.mark.parametrize("path,module,inside", [
    ("L['self'].attention", "attention", True),
    ("L['self'].attention_norm", "attention", False),
    ("L['module']._modules['feed_forward'].w1", "feed_forward", True),
    ("L['self'].moe.router.gate", "moe.router", True),
    ("L['self'].moe.experts", "moe.router", False),
])
def test_a_node_is_inside_a_child_by_dynamos_module_path(path: str, module: str,
                                                         inside: bool) -> None:
    assert corrupt.traced_inside(_node(path), module) is inside
    # A backward node carries its forward's stack under another key.
    assert corrupt.traced_inside(_node(path, "fwd_nn_module_stack"), module) is inside


def test_an_output_beside_choices_is_compared_where_every_runs_choices_agree() -> None:
    """A router's scores sit beside its expert indices: the integer tensors shaped like the
    scores are its choices, and only the positions where the job's, eager's and the
    reference's choices are the same hold comparable scores."""
    scores = torch.rand(4, 2)
    picked = torch.tensor([[0, 3], [1, 2], [5, 4], [7, 6]])
    counts = torch.zeros(8, dtype=torch.long)
    choices = submodules.choices_of((scores, picked, counts), scores)
    assert len(choices) == 1 and choices[0] is picked  # the counts are shaped otherwise
    flipped = picked.clone()
    flipped[1, 0], flipped[3, 1] = 2, 5
    same = submodules.agreeing(choices, (picked.clone(),), (flipped,))
    assert same.tolist() == [[True, True], [False, True], [True, True], [True, False]]
    assert submodules.agreeing((), (), ()) is None  # no choices: the output is not compared
    assert submodules.agreeing(choices, (), choices) is None
    assert submodules.agreeing(choices, (picked[:2],), choices) is None
    # The input gradient: compared on the tokens (rows) whose every choice agrees.
    grads = (torch.rand(4, 3), torch.rand(4, 3), torch.rand(4, 3))
    assert submodules.agreeing_rows(same, grads).tolist() == [True, False, True, False]
    assert submodules.agreeing_rows(None, grads) is None
    assert submodules.agreeing_rows(same, (grads[0], None, grads[2])) is None
    assert submodules.agreeing_rows(same, (torch.rand(2, 3),) * 3) is None


def test_a_sites_specs_cover_each_block_and_direction() -> None:
    site = audit_matrix.Site("attention", "mm", 3, "the output projection")
    specs = site.specs(["0", "5"])
    assert [(s.block, s.graph) for s in specs] == [(0, "forward"), (0, "backward"),
                                                    (5, "forward"), (5, "backward")]
    assert all((s.module, s.op, s.index, s.fraction) == ("attention", "mm", 3, 0.005)
               for s in specs)
    judged = audit_matrix.judge({"verdict": "flagged", "first_wrong": {"forward": "0"},
                                 "first_wrong_module": {"forward": "attention_norm"}}, specs[0])
    assert not judged["right"]  # the right block, the wrong child


def test_a_site_of_a_child_compiled_alone_is_judged_at_that_child_or_one_inside_it() -> None:
    """A stock MoE's router compiles alone (no path from the block in its graph): its site
    names no module, and the audit must name the ``moe`` or a child probed inside it."""
    site = audit_matrix.SITES["deepseek_v3"][1]
    assert (site.module, site.named, site.graphs) == (None, "moe", ("backward",))
    spec, = site.specs(["2"])
    assert (spec.block, spec.graph, spec.module) == (2, "backward", None)

    def result(module: str | None) -> dict:
        return {"verdict": "flagged", "first_wrong": {"backward": "2"},
                "first_wrong_module": {"backward": module}}

    for module, right in (("moe.router", True), ("moe", True), ("attention", False),
                          ("moe_norm", False), (None, False)):
        assert audit_matrix.judge(result(module), spec, site.child)["right"] is right, module
    assert audit_matrix.judge(result("attention"), spec)["right"] is True  # no child asked
    with pytest.raises(ValueError, match="names neither a module nor a child"):
        _ = audit_matrix.Site(None, "mul", 0, "nowhere").named


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama3", "qwen3"])
def test_the_submodule_matrix_on_the_real_trainer(audit_env: Any, model: str) -> None:  # noqa: F811
    """Each site of audit_matrix.SITES (rotary multiply, output projection, norms, SwiGLU) at
    0.5 % in the first, middle and last of three compiled blocks, forward and backward:
    flagged and named at its block, child and direction; a backward fault leaves the forward
    clean."""
    outcomes = audit_env.submodule_matrix(model)
    assert len(outcomes) == 6 * len(audit_matrix.SITES[model])
    wrong = [(o.spec, o.hits, o.judged) for o in outcomes if not o.judged["right"]]
    assert wrong == [], wrong
    assert all(o.hits["hits"] >= 1 for o in outcomes)


@pytest.mark.slow
def test_moe_blocks_the_mixed_compile_keeps_eager_are_compared_whole_with_a_note(
        audit_env: Any) -> None:  # noqa: F811
    trainer, jc = audit_env.build(audit_env.DEEPSEEK + ["--rocm.moe_eager_compile", "on"], 3)
    try:
        result = audit_env.audit(trainer, jc).to_dict()
    finally:
        trainer.close()
    assert result["verdict"] == "ok"
    children = {(t["segment"], t["module"]) for t in result["tensors"] if "module" in t}
    assert children == {("0", m) for m in ("attention", "attention_norm", "feed_forward",
                                             "ffn_norm")}
    assert "blocks 1, 2 compared as a whole, not child by child: nothing in it is compiled " \
        "(the block-level replay covers its eager code)" in result["notes"]
    assert not math.isnan(result["time_s"]["children_compiled"])


@pytest.mark.slow
@pytest.mark.parametrize("op,graph,block,child", [("gather", "forward", 1, "moe.router"),
                                                  ("scatter_add", "backward", 2, "moe.router")])
def test_stock_compiled_moe_blocks_router_faults_are_named_at_the_moe(
        audit_env: Any, op: str, graph: str, block: int, child: str) -> None:  # noqa: F811
    """Stock TorchTitan 0.2.2 compiles a MoE block's attention, norms, router and shared
    experts each alone (``moe_eager_compile = "off"``): the job's own call is probed, nothing
    compiled anew. A clean audit compares every block's children, the MoE's included, and the
    MoE's compiled children inside it; 0.5 % of the router's top-k score gather (its compiled
    forward) and of that gather's backward scatter-add are named at their block and
    ``moe.router``, each in its direction."""
    corrupt.uninstall()
    trainer, jc = audit_env.build(audit_env.DEEPSEEK + ["--rocm.moe_eager_compile", "off"], 3)
    try:
        audit_matrix.install(trainer.model_parts, op, 0)
        spec = corrupt.CorruptSpec(block=block, graph=graph, op=op, index=0, fraction=0.005)
        clean, fault = audit_matrix.run(lambda: audit_env.audit(trainer, jc).to_dict(), [spec],
                                        [0], lambda seed: None)
    finally:
        trainer.close()
        corrupt.uninstall()
    assert clean.verdict == "ok", clean.to_dict()
    assert clean.result["notes"] == []
    children = {(t["segment"], t["module"]) for t in clean.result["tensors"] if "module" in t}
    assert {("1", "moe"), ("1", "moe.router"), ("2", "moe.shared_experts"),
            ("2", "attention")} <= children
    assert fault.hits["hits"] >= 1 and fault.judged["right"], fault.to_dict()
    assert fault.result["first_wrong_module"][graph] == child, fault.to_dict()
    # The router, probed inside the MoE: its gradients compared there (not twice), its scores
    # only where the job's, eager's and the reference's expert indices agree (a top-k choice
    # that rounding flips moves a score far: a false positive on the H200 when compared whole).
    names = [t["name"] for t in fault.result["tensors"] if t["segment"] == str(block)]
    assert f"layers.{block}.moe.router.gate.weight (alone)" in names
    assert f"layers.{block}.moe.router output" not in names
    assert f"layers.{block}.moe.router input grad" not in names
    assert {f"layers.{block}.moe.router output (where the choices agree)",
            f"layers.{block}.moe.router input grad (where the choices agree)"} <= set(names)
    assert len(names) == len(set(names))
