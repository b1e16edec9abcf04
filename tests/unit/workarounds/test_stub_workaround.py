"""A new workaround touches what docs/architecture.md lists ("What a new workaround
touches"): its own files, its registry entry and its ``[rocm]`` mode field. Two stubs in the
test tree (tests/support/stub_workaround.py, no seam; tests/support/stub_seamed/, a seam per
generation) add only those, and every list the package keeps of its workarounds sees them:
the converters, the settings, the decisions, the plan's verdict, the numerics audit's
attribution, the tuner's codegen workarounds and each generation's seams."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import tests.support.stub_generation as stub_generation
from tests.support.stub_workaround import ENTRIES, registered
from titan_rocm import settings
from titan_rocm.adapters.tt022.converters import converter_classes, workarounds_of
from titan_rocm.numerics.attribution import SHAPES, segments
from titan_rocm.plan_format import verdict_lines
from titan_rocm.platform import PlatformFacts
from titan_rocm.tuner.settings import apply_codegen_settings, codegen_workarounds
from titan_rocm.workarounds.base import (
    TORCHTITAN_022,
    TORCHTITAN_030,
    CompileSettings,
    Context,
)
from titan_rocm.workarounds.job import JobWorkarounds
from titan_rocm.workarounds.registry import (
    WORKAROUNDS,
    seam_targets,
    seamed,
    workaround_classes,
)
from titan_rocm.workarounds.seams import TT022, TT030

CPU = PlatformFacts("2.13.0", None, None, 0, None, None, None, "3.9.0", False)
STUBS = list(ENTRIES)


@pytest.fixture
def with_stubs(monkeypatch: pytest.MonkeyPatch):
    with registered(monkeypatch) as settings_class:
        yield settings_class


def _model() -> nn.Module:
    """Block 0 compiled, block 1 eager."""
    model = nn.Module()
    model.layers = nn.ModuleDict({"0": torch.compile(nn.Linear(2, 2)), "1": nn.Linear(2, 2)})
    return model


def _plan(decisions: list, converters: list[str]) -> dict:
    """The fields of a plan ``verdict_lines`` reads, around the job's decisions."""
    return {"model": {"name": "stub", "flavor": "debug"}, "platform": {"arch": None},
            "titan_rocm_listed": True, "converters": converters,
            "workarounds": [d.to_dict() for d in decisions]}


def test_the_registry_s_lists_take_in_a_new_workaround(with_stubs):
    assert STUBS == list(WORKAROUNDS)[-2:]
    assert workarounds_of(["rocm"])[-2:] == STUBS  # 0.2.2: the umbrella runs them
    classes = converter_classes()
    assert classes["rocm"].workaround_names[-2:] == tuple(STUBS)
    assert [classes[f"rocm.{n}"].workaround_names for n in STUBS] == [(n,) for n in STUBS]
    assert settings.mode_fields()[-2:] == tuple(STUBS)
    with pytest.raises(ValueError, match="stub_codegen = 'maybe'.*auto, on, off"):
        settings.check_section({"stub_codegen": "maybe"})
    assert settings.check_section({"stub_seamed": "off"}).stub_seamed == "off"
    assert "stub_codegen" in codegen_workarounds()
    assert "stub_seamed" not in codegen_workarounds()
    assert seamed()["stub_seamed"] == "tests.support.stub_seamed"
    assert "stub_codegen" not in seamed()


def test_a_workaround_without_a_seam_decides_plans_is_attributed_and_tuned(with_stubs):
    ctx = Context(settings=with_stubs(), platform=CPU,
                  compile=CompileSettings(enable=True, components=("model",)))
    job = JobWorkarounds(ctx, ["precision_casts", "stub_codegen"])
    model = _model()
    decisions = job.apply_all(["precision_casts", "stub_codegen"], model, "rocm")
    assert [(d.workaround, d.applied) for d in decisions] == [
        ("precision_casts", False), ("stub_codegen", True)]
    lines = verdict_lines(_plan(decisions, ["rocm"]))
    at = lines.index("  rocm.stub_codegen: the stub's compiler setting at level 3")
    assert lines[at + 1] == "      cost: not measured: a stub"
    blocks = {s.name: s.workarounds for s in segments([model], job.audit_facts([model]))}
    assert blocks["0"] == ["stub_codegen"] and blocks["1"] == []  # compiled code only
    assert apply_codegen_settings({"stub_codegen": "on"}) == ["stub_codegen"]


@pytest.mark.parametrize("framework,generation", [(TORCHTITAN_022, "tt022"),
                                                  (TORCHTITAN_030, "tt030")])
def test_a_workaround_with_a_seam_reaches_each_generation_through_its_own(
        with_stubs, framework, generation):
    assert seam_targets(TT022)["stub_seamed"] == "tests.support.stub_seamed.seams_tt022:Seam"
    assert seam_targets(TT030)["stub_seamed"] == "tests.support.stub_seamed.seams_tt030:Seam"
    ctx = Context(settings=with_stubs(), platform=CPU, framework=framework)
    job = JobWorkarounds(ctx, ["stub_seamed"])
    model = _model()
    (decision,) = job.apply_all(["stub_seamed"], model, "rocm")
    assert decision.applied and decision.details["generation"] == generation
    lines = verdict_lines(_plan([decision], ["rocm.stub_seamed"]))
    assert f"  rocm.stub_seamed: blocks marked through the {generation} seam" in lines
    assert lines[lines.index(f"  rocm.stub_seamed: blocks marked through the {generation} "
                             "seam") + 1].startswith("      cost: not measured alone [1]")
    blocks = {s.name: s.workarounds for s in segments([model], job.audit_facts([model]))}
    assert blocks["1"] == [f"stub_seamed (marked by {generation})"]


def test_a_generation_without_the_new_workaround_s_seam_skips_it_with_the_reason(with_stubs):
    reason = f"titan-rocm has no stub_seamed seam for {stub_generation.FRAMEWORK}"
    auto = stub_generation.job_context(with_stubs(), CPU)
    assert JobWorkarounds(auto, ["stub_seamed"]).decide(nn.Module()) == {"stub_seamed": reason}
    on = stub_generation.job_context(with_stubs(stub_seamed="on"), CPU)
    with pytest.raises(ValueError) as info:
        JobWorkarounds(on, ["stub_seamed"]).require()
    assert str(info.value) == f'[rocm] stub_seamed = "on" cannot apply: {reason}'


def test_the_stubs_leave_with_the_test():
    assert not set(STUBS) & (set(WORKAROUNDS) | set(settings.mode_fields())
                          | set(seam_targets(TT022)))


def test_every_registered_workaround_declares_a_shape_the_audit_knows():
    declared = {name: cls.audit_shapes for name, cls in workaround_classes().items()}
    assert set(declared.values()) <= {*SHAPES, None}, declared
