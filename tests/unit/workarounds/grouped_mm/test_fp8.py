"""The FP8 route of the primus_turbo grouped-MM backend (issue 22 item 5), TorchTitan 0.2.2:
feature detection against the fake Primus-Turbo's generations, the math, torchao-wrapped weights
from TorchTitan's float8 grouped-MM converter, the decision under auto/on/off and the plan."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from tests.support import fake_primus_turbo, fake_torchao
from tests.support.moe_test_models import (
    build_meta,
    clean_patches,
    convert,
    cpu_permute_indices,
    parse,
)
from titan_rocm import platform
from titan_rocm.cli import main
from titan_rocm.platform import PlatformFacts
from titan_rocm.workarounds.grouped_mm import backends, seams_tt022
from titan_rocm.workarounds.grouped_mm.workaround import GroupedMMBinding

REPO = Path(__file__).resolve().parents[4]
FP8_JOB = ("--model.converters", "rocm.grouped_mm,quantize.grouped_mm.float8")
COUNTS = [5, 0, 7, 4]


@pytest.fixture(autouse=True)
def _clean():
    with clean_patches():
        yield
    backends.reset_calls()


def _inputs(pad: int = 3, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    e, dim, hidden = len(COUNTS), 16, 24
    w1, w3 = (torch.randn(e, hidden, dim, generator=gen) * 0.2 for _ in range(2))
    w2 = torch.randn(e, dim, hidden, generator=gen) * 0.2
    x = torch.randn(sum(COUNTS) + pad, dim, generator=gen)
    x[sum(COUNTS):] = 0
    return [t.bfloat16() for t in (w1, w2, w3, x)] + [torch.tensor(COUNTS)]


def _binding(*argv: str) -> GroupedMMBinding:
    from titan_rocm.adapters.tt022.converters.context import job_context

    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        return GroupedMMBinding(job_context(parse(*argv), None))


# -- feature detection ---------------------------------------------------------------------


@pytest.mark.parametrize("generation", ["main", "v0.1.0"])
def test_fp8_is_detected_in_each_primus_turbo_generation_that_has_it(monkeypatch, generation):
    fake_primus_turbo.install(monkeypatch, generation)
    assert backends.primus_turbo_status() is None
    assert backends.primus_turbo_fp8_status() is None


def test_fp8_detection_names_what_this_primus_turbo_lacks(monkeypatch):
    fake_primus_turbo.install(monkeypatch, "bf16_only")
    assert backends.primus_turbo_status() is None  # the BF16 backend is fine
    assert backends.primus_turbo_fp8_status() == (
        "this Primus-Turbo has no primus_turbo.pytorch.ops.grouped_gemm_fp8 (its FP8 grouped "
        "GEMM)")
    ops = sys.modules["primus_turbo.pytorch.ops"]
    monkeypatch.setattr(ops, "grouped_gemm_fp8", lambda a, b, group_lens: a, raising=False)
    assert backends.primus_turbo_fp8_status() == (
        "primus_turbo.pytorch.ops.grouped_gemm_fp8 lacks the parameters trans_b, config (it "
        "takes a, b, group_lens)")
    fake_primus_turbo.install(monkeypatch, "main")
    monkeypatch.delitem(sys.modules, "primus_turbo.pytorch.core.low_precision")
    assert "no Float8QuantConfig with Format.E4M3" in backends.primus_turbo_fp8_status()


def test_fp8_detection_reports_a_missing_primus_turbo_first():
    facts = PlatformFacts.simulated_rocm("gfx942", primus_turbo=False)
    assert "not installed" in backends.primus_turbo_fp8_status(facts)
    assert backends.primus_turbo_fp8_status(
        PlatformFacts.simulated_rocm("gfx942", primus_turbo=True)) is None


# -- the math ------------------------------------------------------------------------------


@pytest.mark.parametrize("generation", ["main", "v0.1.0"])
def test_fp8_experts_match_bf16_within_fp8_rounding_and_train(monkeypatch, generation):
    fake_primus_turbo.install(monkeypatch, generation)
    args = _inputs()
    leaves = [t.clone().requires_grad_() for t in args[:4]]
    out = backends.primus_turbo_fp8_grouped_mm(*leaves, args[4])
    assert out.dtype == torch.bfloat16 and out.shape == args[3].shape
    calls = fake_primus_turbo.CALLS
    assert [name for name, _ in calls] == ["grouped_gemm_fp8"] * 3
    assert {(d["format"], d["granularity"], d["trans_b"]) for _, d in calls} == {
        ("E4M3", "TENSORWISE", True)}
    assert calls[0][1]["group_lens"] == [5, 0, 7, 7]  # 3 padding rows folded into the last
    used = sum(COUNTS)
    bf16 = backends.loop_grouped_mm(*args)
    err = (out[:used].float() - bf16[:used].float()).abs().max()
    assert 0 < err < 0.1 * bf16[:used].float().abs().max()  # rounded, and only by FP8
    out[:used].float().pow(2).sum().backward()
    assert all(leaf.grad is not None and leaf.grad.abs().sum() > 0 for leaf in leaves[:3])


def test_fp8_experts_unwrap_the_float8_converters_weights_and_keep_their_gradients(monkeypatch):
    """TorchTitan's float8 grouped-MM converter wraps the weights (torchao): Primus-Turbo gets
    plain tensors, the gradient reaches the wrapped parameters, and it equals the plain case."""
    fake_primus_turbo.install(monkeypatch)
    monkeypatch.setattr(fake_torchao, "SCALED_CALLS", [])  # this test's calls only
    args = _inputs()
    plain = [t.clone().requires_grad_() for t in args[:3]]
    wrapped = [torch.nn.Parameter(fake_torchao.ScaledGroupedMMTensor(t.clone())) for t in args[:3]]
    used = sum(COUNTS)
    outs = []
    for weights in (plain, wrapped):
        out = backends.primus_turbo_fp8_grouped_mm(*weights, args[3], args[4])
        out[:used].float().pow(2).sum().backward()
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    for p, w in zip(plain, wrapped, strict=True):
        torch.testing.assert_close(w.grad, p.grad, rtol=0, atol=0)
    assert fake_torchao.SCALED_CALLS == []  # torchao's own path was not taken


def test_without_unwrapping_primus_turbo_would_get_torchaos_wrapper(monkeypatch):
    """The unwrap is what makes it work: leave it out and the kernel sees the wrapper."""
    fake_primus_turbo.install(monkeypatch)
    monkeypatch.setattr(backends, "plain_weight", lambda w: w)
    args = _inputs()
    wrapped = [fake_torchao.ScaledGroupedMMTensor(t) for t in args[:3]]
    with pytest.raises(AssertionError, match="plain tensors"):
        backends.primus_turbo_fp8_grouped_mm(*wrapped, args[3], args[4])


def test_the_float8_converters_weights_work_beside_it_through_torchtitans_experts(monkeypatch):
    """TorchTitan 0.2.2's own GroupedExperts with the converter's (stand-in) weights: bound to
    the FP8 route they run Primus-Turbo's FP8 GEMMs; bound to torch they still go through
    torchao's scaled grouped GEMM; both train the wrapped parameters."""
    import torchtitan.models.moe.moe as moe
    from torchtitan.models.moe.moe import GroupedExperts

    cpu_permute_indices(monkeypatch, moe)
    fake_primus_turbo.install(monkeypatch)
    monkeypatch.setattr(fake_torchao, "SCALED_CALLS", [])  # none left for a later test
    args = _inputs(pad=0)
    experts = GroupedExperts(dim=16, hidden_dim=24, num_experts=len(COUNTS), use_grouped_mm=True)
    with torch.no_grad():
        for name, w in zip(("w1", "w2", "w3"), args[:3], strict=True):
            getattr(experts, name).copy_(w.float())
    experts.bfloat16()
    fake_torchao.quantize_experts(experts, ("w1", "w2", "w3"))
    holder = torch.nn.ModuleDict({"experts": experts})
    results = {}
    for route in ("primus_turbo:fp8", "torch"):
        fake_torchao.SCALED_CALLS.clear()
        fake_primus_turbo.CALLS.clear()
        seams_tt022.bind(holder, route)
        experts.zero_grad()
        out = experts(args[3], args[4])
        out.float().pow(2).sum().backward()
        results[route] = (out.detach(), [p.grad.clone() for p in experts.parameters()],
                          len(fake_torchao.SCALED_CALLS), fake_primus_turbo.names())
    fp8, torch_path = results["primus_turbo:fp8"], results["torch"]
    assert fp8[3] == ["grouped_gemm_fp8"] * 3 and fp8[2] == 0
    assert torch_path[2] == 3 and torch_path[3] == []  # torchao's path, three GEMMs
    assert backends.CALLS["primus_turbo:fp8"] == 1 and backends.CALLS["torch"] == 1
    diff = (fp8[0].float() - torch_path[0].float()).norm() / torch_path[0].float().norm()
    assert 0 < diff < 0.1  # FP8 rounding, nothing more
    assert all(g.abs().sum() > 0 for g in fp8[1])


# -- the decision ----------------------------------------------------------------------------


def test_float8_experts_with_primus_turbo_fp8_take_the_fp8_route(monkeypatch):
    fake_primus_turbo.install(monkeypatch)
    b = _binding(*FP8_JOB)
    assert (b.backend, b.precision, b.route) == ("primus_turbo", "fp8", "primus_turbo:fp8")
    assert "quantize.grouped_mm.float8 makes the experts float8" in b.precision_why
    requested = _binding(*FP8_JOB, "--rocm.grouped_mm_backend", "primus_turbo")
    assert requested.route == "primus_turbo:fp8"  # no longer 'would bypass' the converter


def test_float8_experts_with_a_primus_turbo_without_fp8_auto_says_why_once(monkeypatch, caplog):
    from titan_rocm.log import forget

    fake_primus_turbo.install(monkeypatch, "bf16_only")
    forget("grouped_mm_fp8")
    b = _binding(*FP8_JOB)
    assert (b.backend, b.route) == ("torch", "torch")  # what auto picked before: torchao's
    assert b.unmet() is None
    with caplog.at_level(logging.WARNING):
        b._say_fp8_fallback()
        b._say_fp8_fallback()
    lines = [r.getMessage() for r in caplog.records if "no FP8 route" in r.getMessage()]
    assert len(lines) == 1 and "has no primus_turbo.pytorch.ops.grouped_gemm_fp8" in lines[0]
    assert b.plan(torch.nn.Module())["precision"] == "float8: torchao's, through torch._grouped_mm"


def test_float8_experts_with_a_primus_turbo_without_fp8_on_fails_with_the_sentence(monkeypatch):
    fake_primus_turbo.install(monkeypatch, "bf16_only")
    job = parse("--model.name", "qwen3", "--model.flavor", "debugmodel_moe",
                "--model.converters", "rocm.grouped_mm,quantize.grouped_mm.float8",
                "--rocm.grouped_mm", "on", "--rocm.grouped_mm_backend", "primus_turbo")
    with platform.override(PlatformFacts.simulated_rocm("gfx942")), pytest.raises(
            ValueError, match=r'grouped_mm = "on" cannot apply: the FP8 grouped GEMM .* cannot '
            r"be used: auto: quantize.grouped_mm.float8 makes the experts float8, but this "
            r"Primus-Turbo has no primus_turbo.pytorch.ops.grouped_gemm_fp8"):
        convert(job, build_meta(job))


def test_the_precision_setting(monkeypatch):
    fake_primus_turbo.install(monkeypatch)
    asked = _binding("--model.converters", "rocm.grouped_mm",
                     "--rocm.grouped_mm_precision", "fp8")
    assert asked.route == "primus_turbo:fp8" and asked.precision_why.startswith(
        "grouped_mm_precision = fp8")
    assert _binding("--model.converters", "rocm.grouped_mm").route == "primus_turbo"  # BF16 job
    kept = _binding(*FP8_JOB, "--rocm.grouped_mm_precision", "bf16")
    assert kept.route == "torch" and kept.precision_why == "grouped_mm_precision = bf16"
    with pytest.raises(ValueError, match="grouped_mm_backend = 'loop'; accepted with fp8: "
                       "primus_turbo, auto"):
        _binding("--model.converters", "rocm.grouped_mm", "--rocm.grouped_mm_precision", "fp8",
                 "--rocm.grouped_mm_backend", "loop")
    from titan_rocm.settings import RocmSettings

    with pytest.raises(ValueError, match="grouped_mm_precision = 'int8' is not valid; "
                       "accepted: auto, bf16, fp8"):
        RocmSettings(grouped_mm_precision="int8")
    off = _binding(*FP8_JOB, "--rocm.grouped_mm", "off", "--rocm.grouped_mm_precision", "fp8",
                   "--rocm.grouped_mm_backend", "loop")
    assert off.route == "loop"  # off: nothing decided, nothing raised


def test_fp8_asked_without_primus_turbo_auto_falls_back_on_fails(monkeypatch):
    facts = PlatformFacts.simulated_rocm("gfx942", primus_turbo=False)
    from titan_rocm.adapters.tt022.converters.context import job_context

    argv = ("--model.converters", "rocm.grouped_mm", "--rocm.grouped_mm_precision", "fp8")
    with platform.override(facts):
        auto = GroupedMMBinding(job_context(parse(*argv), None))
        on = GroupedMMBinding(job_context(parse(*argv, "--rocm.grouped_mm", "on"), None))
    assert auto.route == "torch" and auto.unmet() is None
    assert "grouped_mm_precision = fp8, but primus_turbo is not installed" in on.unmet()


# -- the plan -----------------------------------------------------------------------------


@pytest.mark.parametrize(("turbo", "backend", "precision"), [
    ("present", "primus_turbo", "fp8: Primus-Turbo's grouped_gemm_fp8 (E4M3, tensorwise "
     "dynamic scaling)"),
    ("absent", "torch", "float8: torchao's, through torch._grouped_mm"),
])
def test_plan_shows_the_fp8_route_of_the_16b_fp8_config(capsys, turbo, backend, precision):
    cfg = str(REPO / "configs" / "deepseek_v3_16b_fp8.toml")
    assert main(["plan", "--arch", "gfx942", "--primus-turbo", turbo, "--job.config_file", cfg,
                 "--rocm.grouped_mm_backend", "auto", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    details = next(w for w in plan["workarounds"] if w["workaround"] == "grouped_mm")["details"]
    assert (details["backend"], details["precision"]) == (backend, precision)
    if turbo == "present":
        assert set(details["layers"].values()) == {"primus_turbo:fp8"}


def test_docs_show_the_current_fp8_plan():
    """docs/grouped-mm.md quotes the plan's first rocm.grouped_mm lines for the 16B FP8 config
    with a Primus-Turbo present, verbatim."""
    from titan_rocm.adapters.tt022.plan import format_plan, make_plan

    cfg = str(REPO / "configs" / "deepseek_v3_16b_fp8.toml")
    text = format_plan(make_plan(["--job.config_file", cfg, "--rocm.grouped_mm_backend", "auto"],
                                 arch="gfx942", primus_turbo="present"))
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("  rocm.grouped_mm "))
    end = next(i for i in range(start, len(lines)) if "primus_turbo_fp8:" in lines[i])
    assert "\n".join(lines[start:end + 1]) in (REPO / "docs" / "grouped-mm.md").read_text()
