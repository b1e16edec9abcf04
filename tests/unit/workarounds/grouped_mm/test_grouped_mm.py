"""rocm.grouped_mm: backends, registration, binding through the live model (CPU)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from tests.support.moe_test_models import (
    build_meta,
    clean_patches,
    convert,
    cpu_permute_indices,
    decisions,
    parse,
)
from titan_rocm import platform
from titan_rocm.platform import PlatformFacts
from titan_rocm.workarounds import grouped_mm
from titan_rocm.workarounds.grouped_mm import backends, seams_tt022
from titan_rocm.workarounds.grouped_mm.workaround import GroupedMMBinding

ON = ("--model.converters", "rocm.grouped_mm", "--rocm.grouped_mm", "on")


@pytest.fixture(autouse=True)
def _clean():
    saved = dict(backends._registry)
    with clean_patches():
        yield
    backends._registry.clear()
    backends._registry.update(saved)


def _experts_inputs(dtype: torch.dtype, counts: list[int], pad: int, dim=32, hidden=48, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_experts = len(counts)
    w1 = torch.randn(num_experts, hidden, dim, generator=gen) * 0.1
    w2 = torch.randn(num_experts, dim, hidden, generator=gen) * 0.1
    w3 = torch.randn(num_experts, hidden, dim, generator=gen) * 0.1
    x = torch.randn(sum(counts) + pad, dim, generator=gen)
    x[sum(counts):] = 0  # TorchTitan's padding rows gather a zero row
    n = torch.tensor(counts, dtype=torch.int64)
    return [t.to(dtype) for t in (w1, w2, w3, x)] + [n]


def _reference(w1, w2, w3, x, n):
    """Float64 SwiGLU experts, one expert at a time; padding rows zero."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    start = 0
    for e, c in enumerate(n.tolist()):
        xe = x[start : start + c].double()
        h = torch.nn.functional.silu(xe @ w1[e].double().T) * (xe @ w3[e].double().T)
        out[start : start + c] = h @ w2[e].double().T
        start += c
    return out


COUNTS = [8, 0, 16, 8]  # an expert with no tokens, like real routing


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_loop_matches_torch_grouped_mm_on_cpu(dtype):
    """torch._grouped_mm runs on CPU in torch 2.13 (forward and backward): compare directly."""
    args = _experts_inputs(dtype, COUNTS, pad=8)
    used = sum(COUNTS)
    loop = backends.loop_grouped_mm(*args)
    stock = backends.torch_grouped_mm(*args)
    assert loop.dtype == stock.dtype == dtype
    # The torch path computes in BF16 whatever the dtype (as TorchTitan's): BF16 tolerance.
    torch.testing.assert_close(loop[:used].float(), stock[:used].float(), rtol=2e-2, atol=2e-2)
    ref = _reference(*args)
    torch.testing.assert_close(loop.double(), ref, **(
        dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)))
    assert torch.count_nonzero(loop[used:]) == 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_loop_and_torch_gradients_agree_in_bf16(device):
    grads = {}
    for name, fn in (("loop", backends.loop_grouped_mm), ("torch", backends.torch_grouped_mm)):
        args = [a.to(device) for a in _experts_inputs(torch.bfloat16, COUNTS, pad=8)]
        leaves = [a.requires_grad_() for a in args[:4]]
        out = fn(*args)
        out[: sum(COUNTS)].float().pow(2).sum().backward()
        # Rows past the last group are padding: torch._grouped_mm leaves their input grads
        # undefined on CPU (TorchTitan drops them); compare the real rows.
        grads[name] = [leaf.grad.float().cpu() for leaf in leaves[:3]]
        grads[name].append(leaves[3].grad[: sum(COUNTS)].float().cpu())
    for g_loop, g_torch in zip(grads["loop"], grads["torch"], strict=True):
        torch.testing.assert_close(g_loop, g_torch, rtol=3e-2, atol=3e-2)


def _fake_primus_turbo(monkeypatch, calls: list):
    """A stand-in ``primus_turbo.pytorch`` with Primus-Turbo's grouped_gemm contract."""

    def grouped_gemm(a, b, group_lens, group_offs=None, trans_b=False, num_cu=None):
        assert int(group_lens.sum()) == a.shape[0], "Primus-Turbo needs groups covering a"
        assert group_lens.dtype == torch.int64 and trans_b
        calls.append(group_lens.tolist())
        pieces, start = [], 0
        for g, rows in enumerate(group_lens.tolist()):
            pieces.append(a[start : start + rows] @ b[g].transpose(0, 1))
            start += rows
        return torch.cat(pieces)

    root = types.ModuleType("primus_turbo")
    root.__path__ = []  # a package
    root.__spec__ = importlib.machinery.ModuleSpec("primus_turbo", None, is_package=True)
    pytorch = types.ModuleType("primus_turbo.pytorch")
    pytorch.ops = types.SimpleNamespace(grouped_gemm=grouped_gemm)
    root.pytorch = pytorch
    monkeypatch.setitem(sys.modules, "primus_turbo", root)
    monkeypatch.setitem(sys.modules, "primus_turbo.pytorch", pytorch)


def test_primus_turbo_adapter_folds_padding_into_last_group(monkeypatch):
    calls: list = []
    _fake_primus_turbo(monkeypatch, calls)
    assert backends.primus_turbo_status() is None
    args = _experts_inputs(torch.bfloat16, COUNTS, pad=8)
    out = backends.primus_turbo_grouped_mm(*args)
    assert calls[0] == [8, 0, 16, 16]  # 8 padding rows folded into the last expert
    assert args[4].tolist() == COUNTS  # the caller's counts are left alone
    loop = backends.loop_grouped_mm(*args)
    torch.testing.assert_close(out.float(), loop.float(), rtol=2e-2, atol=2e-2)
    assert torch.count_nonzero(out[sum(COUNTS):]) == 0


def test_primus_turbo_missing_is_reported():
    if importlib.util.find_spec("primus_turbo") is not None:
        pytest.skip("Primus-Turbo is installed here")
    assert "not installed" in backends.primus_turbo_status()


def test_auto_resolution(monkeypatch):
    assert backends.resolve("auto", is_rocm=False) == ("torch", "auto: not a ROCm build")
    if importlib.util.find_spec("primus_turbo") is None:
        name, why = backends.resolve("auto", is_rocm=True)
        assert name == "torch" and "not installed" in why
    _fake_primus_turbo(monkeypatch, [])
    assert backends.resolve("auto", is_rocm=True)[0] == "primus_turbo"
    assert backends.resolve("loop", is_rocm=True) == ("loop", "requested")


def test_bad_backend_name_fails_at_converter_init():
    job = parse("--model.name", "qwen3", "--model.flavor", "debugmodel_moe", *ON,
                "--rocm.grouped_mm_backend", "cutlass")
    with pytest.raises(ValueError, match=r"grouped_mm_backend = 'cutlass'.*auto, torch, loop"):
        convert(job, build_meta(job))


def test_primus_turbo_requested_in_on_mode_without_it_names_what_is_missing():
    if importlib.util.find_spec("primus_turbo") is not None:
        pytest.skip("Primus-Turbo is installed here")
    job = parse("--model.name", "qwen3", "--model.flavor", "debugmodel_moe", *ON,
                "--rocm.grouped_mm_backend", "primus_turbo")
    with pytest.raises(ValueError, match="primus_turbo.*not installed"):
        convert(job, build_meta(job))


def test_register_backend_validation():
    fn = backends.loop_grouped_mm
    with pytest.raises(ValueError, match="reserved"):
        grouped_mm.register_backend("auto", fn)
    with pytest.raises(ValueError, match="non-empty"):
        grouped_mm.register_backend("", fn)
    with pytest.raises(TypeError, match="callable"):
        grouped_mm.register_backend("mine", 3)
    with pytest.raises(ValueError, match="already registered"):
        grouped_mm.register_backend("loop", fn)
    grouped_mm.register_backend("mine", fn)
    assert "mine" in grouped_mm.backend_names()
    grouped_mm.register_backend("mine", fn, replace=True)


def test_qwen3_moe_binding_and_plan_through_converter():
    job = parse("--model.name", "qwen3", "--model.flavor", "debugmodel_moe", *ON,
                "--rocm.grouped_mm_backend", "loop")
    model = build_meta(job)
    decision = decisions(convert(job, model))["grouped_mm"]
    assert decision.applied, decision.reason
    assert decision.details["bound_in"] == ["torchtitan.models.moe.moe"]
    assert decision.details["layers"] == {f"layers.{i}.moe.experts": "loop" for i in range(8)}
    import torchtitan.models.moe.moe as moe_module

    bound = moe_module._run_experts_grouped_mm
    assert "_run_experts_grouped_mm_dynamic" in bound.__qualname__
    assert bound.titan_rocm_backend == "loop"


def test_stock_llama4_apply_compile_leaves_the_bound_function_alone():
    """Its already-patched test reads __qualname__: the bound function is not compiled again."""
    from torchtitan.models.llama4.infra.parallelize import apply_compile, moe_module

    job = parse("--model.name", "qwen3", "--model.flavor", "debugmodel_moe", *ON,
                "--activation_checkpoint.mode", "none", "--compile.enable")
    model = build_meta(job)
    convert(job, model)
    bound = moe_module._run_experts_grouped_mm
    apply_compile(model, job.compile, True)
    assert moe_module._run_experts_grouped_mm is bound


def test_deepseek_on_cpu_keeps_for_loop_and_says_why():
    """TorchTitan sets use_grouped_mm = false below capability 9.0: nothing to bind."""
    job = parse("--model.name", "deepseek_v3", "--model.flavor", "debugmodel", *ON)
    decision = decisions(convert(job, build_meta(job)))["grouped_mm"]
    assert not decision.applied
    assert "use_grouped_mm = false" in decision.reason
    assert all("for-loop" in v for v in decision.details["layers"].values())


def test_llama3_and_gpt_oss_are_skipped_with_reasons():
    job = parse("--model.name", "llama3", "--model.flavor", "debugmodel", *ON)
    assert decisions(convert(job, build_meta(job)))["grouped_mm"].reason == (
        "model has no MoE blocks")
    job = parse("--model.name", "gpt_oss", "--model.flavor", "debugmodel", *ON)
    decision = decisions(convert(job, build_meta(job), ))["grouped_mm"]
    assert "gpt_oss" in decision.reason and "not covered" in decision.reason
    assert all("not covered" in v for v in decision.details["layers"].values())


def test_auto_mode_on_simulated_rocm_binds_torch_without_primus():
    if importlib.util.find_spec("primus_turbo") is not None:
        pytest.skip("Primus-Turbo is installed here")
    job = parse("--model.name", "qwen3", "--model.flavor", "debugmodel_moe",
                "--model.converters", "rocm.grouped_mm")
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        decision = decisions(convert(job, build_meta(job)))["grouped_mm"]
    assert decision.applied
    assert decision.details["backend"] == "torch"
    assert "auto" in decision.details["why"]


def _load_second_copy(name: str) -> types.ModuleType:
    """torchtitan/models/moe loaded again as package ``name``: moe.py becomes ``name.moe``."""
    import torchtitan.models.moe as canonical

    folder = Path(canonical.__file__).parent
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return sys.modules[f"{name}.moe"]


def test_binding_reaches_experts_from_a_second_copy_of_moe_py(monkeypatch):
    import torchtitan.models.moe.moe as canonical

    stock = canonical._run_experts_grouped_mm
    name = "titan_rocm_test_second_moe"
    try:
        second = _load_second_copy(name)
        assert second is not canonical and second.GroupedExperts is not canonical.GroupedExperts
        cpu_permute_indices(monkeypatch, second)
        experts = second.GroupedExperts(dim=32, hidden_dim=48, num_experts=4, use_grouped_mm=True)
        model = nn.ModuleDict({"moe": nn.ModuleDict({"experts": experts})})
        w1, w2, w3, x, n = _experts_inputs(torch.float32, COUNTS, pad=0)
        with torch.no_grad():
            experts.w1.copy_(w1), experts.w2.copy_(w2), experts.w3.copy_(w3)

        assert seams_tt022.bind(model, "loop") == [f"{name}.moe"]
        assert second._run_experts_grouped_mm.titan_rocm_backend == "loop"
        assert canonical._run_experts_grouped_mm is stock  # the copy the model does not use
        assert seams_tt022.layer_backends(model) == {"moe.experts": "loop"}

        out = experts(x, n)  # through TorchTitan's own padding wrapper
        assert grouped_mm.call_counts() == {"loop": 1}
        torch.testing.assert_close(out.double(), _reference(w1, w2, w3, x, n), rtol=1e-5,
                                   atol=1e-5)
        seams_tt022.unbind_all()
        assert not hasattr(second._run_experts_grouped_mm, "titan_rocm_backend")
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(f"{name}.")]:
            del sys.modules[key]


def test_registered_backend_is_called_by_the_model(monkeypatch):
    seen = []

    def mine(w1, w2, w3, x, n):
        seen.append(x.shape)
        return backends.loop_grouped_mm(w1, w2, w3, x, n)

    grouped_mm.register_backend("mine", mine)
    import torchtitan.models.moe.moe as canonical

    cpu_permute_indices(monkeypatch, canonical)
    experts = canonical.GroupedExperts(dim=32, hidden_dim=48, num_experts=4, use_grouped_mm=True)
    w1, w2, w3, x, n = _experts_inputs(torch.float32, COUNTS, pad=0)
    with torch.no_grad():
        experts.w1.copy_(w1), experts.w2.copy_(w2), experts.w3.copy_(w3)
    seams_tt022.bind(experts, "mine")
    experts(x, n)
    assert len(seen) == 1 and grouped_mm.call_counts() == {"mine": 1}


def _binding(*argv: str) -> GroupedMMBinding:
    from titan_rocm.adapters.tt022.converters.context import job_context


    return GroupedMMBinding(job_context(parse(*argv), None))


def test_float8_experts_keep_the_torch_path():
    """torchao's float8/mx experts intercept torch._grouped_mm: auto picks torch, others fail."""
    fp8 = ("--model.converters", "rocm.grouped_mm,quantize.grouped_mm.float8")
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        binding = _binding(*fp8)
    assert binding.backend == "torch"
    assert "quantize.grouped_mm.float8" in binding.why
    with pytest.raises(ValueError, match="'loop' would bypass quantize.grouped_mm.float8"):
        _binding(*fp8, "--rocm.grouped_mm_backend", "loop")
    assert _binding(*fp8, "--rocm.grouped_mm_backend", "torch").backend == "torch"
    # Turned off, the contradiction does not matter.
    _binding(*fp8, "--rocm.grouped_mm_backend", "loop", "--rocm.grouped_mm", "off")
