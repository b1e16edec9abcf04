"""The bound experts function is compiled where stock TorchTitan compiles its own, and only there.

A real deepseek_v3 debug model cut to two blocks (one dense, one MoE), FP32 on CPU, built as
train.py builds it (meta -> converters -> the model's own ``parallelize_fn`` -> init), runs one
forward and backward. The compile backend is a recorder registered with Dynamo: it keeps every
graph Dynamo hands it and runs it as traced. Stock TorchTitan never compiles the ``experts``
module, only the function it calls; so a recorded graph containing ``torch._grouped_mm``
proves the experts function itself went through Dynamo.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.moe_test_models import (
    build_meta,
    clean_patches,
    convert,
    cpu_histc,
    cpu_permute_indices,
    decisions,
    loss_and_grads,
    materialize,
    parse,
    random_batch,
    two_block_deepseek_args,
    world_of_one,
)
from titan_rocm import patches
from titan_rocm.workarounds import grouped_mm, moe_blocks
from titan_rocm.workarounds.grouped_mm import backends, seams_tt022
from titan_rocm.workarounds.grouped_mm.experts_compile import CompileRequest, ExpertsRunner

RECORDER = "titan_rocm_test_recorder"
GRAPHS: list[torch.fx.GraphModule] = []


def _recorder(gm: torch.fx.GraphModule, example_inputs):  # noqa: ANN001
    GRAPHS.append(gm)
    return gm.forward


torch._dynamo.register_backend(name=RECORDER)(_recorder)


@pytest.fixture(autouse=True)
def _clean():
    """Each test starts from the process-wide state it reads, whatever ran before it: no
    titan-rocm patch installed (the reference is stock TorchTitan, and Dynamo traces
    TorchTitan's own apply_compile), no experts bound, the call counters at zero, Dynamo's
    caches empty, and its capture_scalar_outputs at the default."""
    saved = dict(backends._registry), set(backends._compilable)
    patches.restore()
    seams_tt022.unbind_all()
    grouped_mm.reset_calls()
    moe_blocks.EAGER_FORWARD_CALLS.clear()
    GRAPHS.clear()
    torch._dynamo.reset()
    with clean_patches(), torch._dynamo.config.patch(capture_scalar_outputs=False):
        yield
    backends._registry.clear()
    backends._registry.update(saved[0])
    backends._compilable.clear()
    backends._compilable.update(saved[1])


def _grouped_mm_graphs() -> list[torch.fx.GraphModule]:
    return [gm for gm in GRAPHS if "_grouped_mm" in gm.code]


def _job(backend: str, mixed: bool, scope: str = "block"):
    return parse(
        "--model.name", "deepseek_v3", "--model.flavor", "debugmodel",
        "--training.seq_len", "16", "--activation_checkpoint.mode", "none",
        "--compile.enable", "--compile.backend", RECORDER,
        "--model.converters", "rocm.grouped_mm,rocm.moe_eager_compile",
        "--rocm.grouped_mm", "on", "--rocm.grouped_mm_backend", backend,
        "--rocm.moe_eager_compile", "on" if mixed else "off", "--rocm.moe_eager_scope", scope,
    )  # fmt: skip


@pytest.mark.parametrize(
    "mixed,scope",
    [(False, "block"), (True, "block"), (True, "moe")],
    ids=["stock_moe_compile", "mixed_compile", "mixed_compile_moe_scope"],
)
def test_experts_compiled_only_where_stock_compiles_them(monkeypatch, mixed, scope):
    # Bit for bit against eager: after an earlier in-process deepseek_v3 trainer this holds
    # because tests/conftest.py puts back the MoE module's grouped-GEMM function that
    # TorchTitan's apply_compile replaces with its compiled self for the whole process.
    import torchtitan.models.moe.moe as moe_module
    from torchtitan.protocols.train_spec import get_train_spec

    cpu_permute_indices(monkeypatch, moe_module)  # TorchTitan's padding kernel is Triton
    cpu_histc(monkeypatch)  # TorchTitan's router counts int64 with histc (GPU only)
    job = _job("torch", mixed, scope)
    args = two_block_deepseek_args(job)
    batch = random_batch(args.vocab_size, batch=2, seq_len=16, device="cpu")

    # Reference first: eager, before anything is bound.
    reference = build_meta(job, args=args)
    materialize(reference, seed=0, device="cpu")
    loss_e, grads_e = loss_and_grads(reference, *batch)

    model = build_meta(job, args=args)
    made = decisions(convert(job, model))
    assert made["grouped_mm"].applied
    assert made["moe_eager_compile"].applied is mixed
    planned = made["grouped_mm"].details["experts_compile"]  # what titan-rocm plan prints
    assert planned.startswith("eager: rocm.moe_eager_compile" if mixed else "compiled"), planned
    get_train_spec("deepseek_v3").parallelize_fn(model, world_of_one(), job)
    materialize(model, seed=0, device="cpu")
    GRAPHS.clear()
    loss_c, grads_c = loss_and_grads(model, *batch)

    runner = seams_tt022.bound_runner(model.layers["1"].moe.experts)
    assert runner is not None and runner.compiled is (not mixed), runner.why
    assert grouped_mm.call_counts() == {"torch": 1}
    if mixed:
        assert "rocm.moe_eager_compile" in runner.why
        assert ("moe_eager_scope" in runner.why) is (scope == "moe")  # says what is eager
        assert moe_blocks.eager_forward_calls() == {"1": 1}
        assert not _grouped_mm_graphs()  # the MoE module, experts included, ran eager
    else:
        assert len(_grouped_mm_graphs()) == 1  # the experts function, as stock compiles it
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    for name, g in grads_e.items():
        torch.testing.assert_close(grads_c[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_loop_backend_stays_eager_and_says_why():
    job = _job("loop", mixed=False)
    made = decisions(convert(job, build_meta(job, use_grouped_mm=True)))
    why = made["grouped_mm"].details["experts_compile"]
    assert why.startswith("eager: backend 'loop' is not traceable"), why


def test_no_compile_keeps_experts_eager():
    job = parse("--model.name", "deepseek_v3", "--model.flavor", "debugmodel",
                "--model.converters", "rocm.grouped_mm", "--rocm.grouped_mm", "on")
    made = decisions(convert(job, build_meta(job, use_grouped_mm=True)))
    assert made["grouped_mm"].details["experts_compile"] == (
        "eager: TorchTitan does not compile the model"
    )


def _inputs(tokens: int = 6):
    """bf16 grouped MM wants 16-byte row strides: dims multiple of 8."""
    gen = torch.Generator().manual_seed(0)
    w1, w3 = (torch.randn(2, 32, 16, generator=gen) for _ in range(2))
    w2 = torch.randn(2, 16, 32, generator=gen)
    x = torch.randn(tokens, 16, generator=gen)
    return w1, w2, w3, x, torch.tensor([tokens // 2, tokens - tokens // 2])


def _mine(w1, w2, w3, x, n):
    """A registered backend that shows whether it ran traced: x * 2 when compiling."""
    if torch.compiler.is_compiling():
        return x * 2
    return backends.loop_grouped_mm(w1, w2, w3, x, n)


def test_registered_backend_is_compiled_only_when_it_opts_in():
    request = CompileRequest(enabled=True, backend=RECORDER)
    inputs = _inputs()
    backends.register_backend("mine", _mine)
    runner = ExpertsRunner("mine", _mine, request)
    torch.testing.assert_close(runner(*inputs), backends.loop_grouped_mm(*inputs))
    assert runner.compiled is False and "register_backend(..., compilable=True)" in runner.why
    assert not GRAPHS

    backends.register_backend("mine", _mine, replace=True, compilable=True)
    runner = ExpertsRunner("mine", _mine, request)
    for _ in range(2):  # the traced branch is what runs, from one graph
        torch.testing.assert_close(runner(*inputs), inputs[3] * 2)
    assert runner.compiled is True
    assert len(GRAPHS) == 1

    backends.register_backend("mine", _mine, replace=True)  # re-registered without: opts out
    assert not backends.is_compilable("mine")


def test_ep_marks_the_token_dimension_dynamic():
    """Under expert parallelism the tokens per rank vary: one graph serves every count."""
    runner = ExpertsRunner("torch", backends.torch_grouped_mm,
                           CompileRequest(enabled=True, backend=RECORDER, ep_enabled=True))
    for tokens in (6, 10, 14):
        inputs = _inputs(tokens)
        torch.testing.assert_close(runner(*inputs), backends.torch_grouped_mm(*inputs))
    assert runner.compiled is True
    assert len(GRAPHS) == 1
