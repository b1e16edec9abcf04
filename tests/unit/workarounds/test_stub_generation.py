"""A new TorchTitan generation plugs in as one adapter plus one seam per workaround: a stub one
(tests/support/stub_generation.py) runs every seam-using workaround's decision logic through its own
seams; a seam that is missing or moved is the workaround's skip reason (``auto``) or start-up
failure (``on``), never a traceback from inside it."""

from __future__ import annotations

import pytest
import torch.nn as nn

import tests.support.stub_generation as stub
from titan_rocm.platform import PlatformFacts
from titan_rocm.settings import RocmSettings
from titan_rocm.torchtitan_version import FOLDED_TOKENS, UNREAD_SHAPES, Installed
from titan_rocm.workarounds.base import TORCHTITAN_030, Context
from titan_rocm.workarounds.job import JobWorkarounds
from titan_rocm.workarounds.registry import seam_targets, seamed
from titan_rocm.workarounds.seams import TT022, TT030, Generation

ROCM = PlatformFacts.simulated_rocm("gfx942")
SEAMED = ("grouped_mm", "moe_eager_compile", "mla_ck_backward", "divergence_guard")


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner_attention = nn.Identity()


@pytest.fixture(autouse=True)
def _calls():
    stub.CALLS.clear()
    yield
    stub.CALLS.clear()


def test_every_workaround_decides_and_applies_through_the_stub_generation_seams():
    ctx = stub.job_context(RocmSettings(), ROCM)
    job = JobWorkarounds(ctx, SEAMED)
    model = nn.Module()
    model.attention = Attention()
    w = job.instances
    assert w["grouped_mm"].check(model) is None
    w["grouped_mm"].apply(model)
    assert w["grouped_mm"].plan(model)["bound_in"] == ["stub experts (torch)"]
    assert w["grouped_mm"].plan(model)["experts_compile"] == "as the stub compiles them"
    w["moe_eager_compile"].apply(model)
    # The default scope is "block" (issue 22: what AMD-AGI/Primus PR #962 validated).
    assert w["moe_eager_compile"]._patched == "stub compile (block)"
    w["divergence_guard"].apply(model)
    assert w["divergence_guard"].trainer_seam is not None
    assert w["divergence_guard"].plan(model)["observes"][0] == "the stub trainer's loss"
    assert w["mla_ck_backward"].check(model) == (
        "attention runs Identity; rocm.mla_ck_backward replaces only the stub's attention")
    assert {name for name, _method in stub.CALLS} == set(SEAMED)
    assert ("grouped_mm", "bind") in stub.CALLS and ("mla_ck_backward", "kinds") in stub.CALLS


def test_the_stub_generation_has_a_seam_for_every_workaround_that_has_one():
    """As a new generation must: the seamed workarounds are the registry's (``has_seam``)."""
    assert set(stub.SEAMS) == set(seamed())
    assert set(seam_targets(TT022)) == set(seam_targets(TT030)) == set(seamed())


@pytest.mark.parametrize("name", SEAMED)
def test_a_seam_the_generation_lacks_is_the_skip_reason_and_the_on_failure(name):
    partial = Generation(stub.FRAMEWORK, {k: v for k, v in stub.SEAMS.items() if k != name})
    reason = f"titan-rocm has no {name} seam for {stub.FRAMEWORK}"
    auto = JobWorkarounds(stub.job_context(RocmSettings(), ROCM, partial), [name])
    assert auto.decide(nn.Module())[name] == reason
    on = JobWorkarounds(stub.job_context(RocmSettings(**{name: "on"}), ROCM, partial), [name])
    with pytest.raises(ValueError) as info:
        on.require()
    assert str(info.value) == f'[rocm] {name} = "on" cannot apply: {reason}'


def test_a_seam_that_does_not_load_says_so_without_a_traceback():
    broken = Generation(stub.FRAMEWORK, {**stub.SEAMS, "grouped_mm": "no_such_module:Seam"})
    job = JobWorkarounds(stub.job_context(RocmSettings(), ROCM, broken), ["grouped_mm"])
    reason = job.decide(nn.Module())["grouped_mm"]
    assert reason.startswith(f"its {stub.FRAMEWORK} seam (no_such_module:Seam) does not load: ")


MAIN = Installed("0.2.2", "/stand-in", "0.3", variants=(FOLDED_TOKENS,))
"""What ``torchtitan_version.detect()`` finds on TorchTitan main at b5bcd76c."""


def test_main_s_folded_tokens_take_mla_s_folded_seam_and_leave_the_others():
    main = TT030.for_installed(MAIN)
    assert seam_targets(main)["mla_ck_backward"] == (
        "titan_rocm.workarounds.mla_ck_backward.seams_tt030:FoldedSeam")
    assert {k: v for k, v in seam_targets(main).items() if k != "mla_ck_backward"} == {
        k: v for k, v in seam_targets(TT030).items() if k != "mla_ck_backward"}
    assert (main.moved, main.framework) == ({}, TT030.framework)
    assert TT030.for_installed(Installed("0.3.0", "/stand-in", "0.3")) == TT030


@pytest.mark.parametrize("shape", UNREAD_SHAPES, ids=lambda s: s.workaround)
def test_a_change_main_has_not_made_auto_skips_and_on_fails_with_its_sentence(shape):
    """#4164's attention package (MLA) and #4539's experts (grouped MM), as detect() reports
    them: the seam moved, whatever variant the rest of main is."""
    name, reason = shape.workaround, shape.reason
    main = TT030.for_installed(
        Installed("0.2.2", "/stand-in", "0.3", moved={name: reason}, variants=(FOLDED_TOKENS,)))
    ctx = Context(platform=ROCM, framework=TORCHTITAN_030, generation=main)
    assert JobWorkarounds(ctx, [name]).decide(nn.Module()) == {name: reason}
    on = Context(settings=RocmSettings(**{name: "on"}), platform=ROCM,
                 framework=TORCHTITAN_030, generation=main)
    with pytest.raises(ValueError) as info:
        JobWorkarounds(on, [name]).require()
    assert str(info.value) == f'[rocm] {name} = "on" cannot apply: {reason}'
    skipped = JobWorkarounds(ctx, [name]).apply(name, nn.Module(), "x")
    assert (skipped.applied, skipped.reason, skipped.details) == (False, reason, {})
