"""On a GPU: the workarounds' pieces with real kernels. Run: ``python -m pytest -q tests/gpu``.

Every test here is marked ``gpu`` and skipped with a reason on CPU machines. Each has a CPU
sibling that exercises the same logic: tests/unit/workarounds/grouped_mm/test_grouped_mm.py
(loop vs torch), tests/unit/workarounds/moe_eager_compile/test_moe_eager_compile.py and
tests/unit/workarounds/test_compiled_numerics.py (mixed compile),
tests/unit/workarounds/triton_war/test_compile_hook.py (wrapper on HIP cross-compiles),
tests/unit/workarounds/divergence_guard/test_divergence_guard.py
(no host reads between checks). What these add is the real device: CUDA kernels, Inductor's
GPU codegen, the CUDA sync debug mode.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def _experts(e: int = 4, dim: int = 64, hidden: int = 128) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(0)
    w1 = torch.randn(e, hidden, dim, device="cuda", generator=g, dtype=torch.bfloat16) * 0.05
    w2 = torch.randn(e, dim, hidden, device="cuda", generator=g, dtype=torch.bfloat16) * 0.05
    w3 = torch.randn(e, hidden, dim, device="cuda", generator=g, dtype=torch.bfloat16) * 0.05
    counts = torch.tensor([16, 0, 40, 8], device="cuda", dtype=torch.int64)
    x = torch.randn(64, dim, device="cuda", generator=g, dtype=torch.bfloat16)
    return w1, w2, w3, x, counts


def test_loop_backend_matches_torch_grouped_mm_on_gpu() -> None:
    from titan_rocm.workarounds.grouped_mm.backends import get_backend

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("torch._grouped_mm needs SM90+ on CUDA")
    args = _experts()
    ref = get_backend("torch")(*args)
    loop = get_backend("loop")(*args)
    # bf16 inputs, fp32 accumulation in both: differences are bf16 rounding of the output.
    torch.testing.assert_close(loop.float(), ref.float(), rtol=2e-2, atol=2e-3)


def test_mixed_compile_on_gpu_dense_compiled_moe_eager() -> None:
    import copy

    from torch._dynamo.utils import counters
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    from titan_rocm.workarounds import moe_blocks
    from titan_rocm.workarounds.moe_eager_compile import seams_tt022

    job = ConfigManager().parse_args(["--compile.enable", "--model.name", "deepseek_v3",
                                      "--training.seq_len", "128"])
    spec = get_train_spec("deepseek_v3")
    args = copy.deepcopy(spec.model_args["debugmodel"])
    args.update_from_config(job)
    with torch.device("meta"):  # as TorchTitan's Trainer: build on meta, then materialise
        model = spec.model_cls(args)
    model.to_empty(device="cuda")
    with torch.no_grad():
        model.init_weights()
    seams_tt022.compile_blocks(model, backend="inductor")
    decisions = moe_blocks.plan_blocks(model)
    assert list(decisions.values()).count("fullgraph") >= 1
    counters.clear()
    before = sum(moe_blocks.eager_forward_calls().values())
    tokens = torch.randint(0, args.vocab_size, (2, 128), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(tokens)
    out.float().mean().backward()
    torch.cuda.synchronize()
    n_moe = sum(1 for d in decisions.values() if d.startswith("eager"))
    assert sum(moe_blocks.eager_forward_calls().values()) - before == n_moe
    assert counters["stats"]["unique_graphs"] >= 1  # the dense block(s) compiled
    assert sum(counters["graph_break"].values()) == 0


def test_triton_wrapper_sees_cuda_compiles_and_skips_them() -> None:
    import triton
    import triton.language as tl

    from titan_rocm.workarounds.triton_war import compile_hook, stats

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    compile_hook.install()
    try:
        before = stats.local().skipped_non_hip
        x = torch.zeros(1000, device="cuda")
        add_one[(4,)](x, 1000, BLOCK=256)
        torch.cuda.synchronize()
        assert torch.all(x == 1)
        assert stats.local().skipped_non_hip == before + 1
    finally:
        compile_hook.uninstall()


def test_divergence_guard_record_adds_no_host_sync() -> None:
    from titan_rocm.workarounds.divergence_guard.record import NonFiniteRecord

    record = NonFiniteRecord()
    labels = torch.randint(0, 100, (4, 32), device="cuda")
    # CUDA's sync debug mode raises on any synchronising call: the per-step updates must not.
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 20):
            loss = torch.full((), 2.5 * step, device="cuda")
            if step == 7:
                loss = loss * float("nan")
            record.observe_loss(loss, labels)
            record.observe_grad_norm(torch.full((), 1.0, device="cuda"))
            record.end_step(step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    row = record.row()  # the one read, at a check point
    assert row.step == 7


def test_divergence_guard_log_step_read_waits_for_nothing() -> None:
    """The snapshot enqueued before the trainer's own ``.item()`` has landed when read."""
    from titan_rocm.workarounds.divergence_guard.record import NonFiniteRecord
    from titan_rocm.workarounds.divergence_guard.snapshot import Snapshot

    record = NonFiniteRecord()
    loss = torch.full((), float("nan"), device="cuda")
    record.observe_loss(loss)
    record.end_step(3)
    big = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        work = big @ big  # keep the stream busy so the copy is really in flight
        snapshot = Snapshot.take(record, 3, loss.device)  # must not synchronise
    finally:
        torch.cuda.set_sync_debug_mode("default")
    work.sum().item()  # what TorchTitan does at a log step: waits for the stream
    assert snapshot.ready()
    assert snapshot.rows()[0].step == 3 and not snapshot.waited
