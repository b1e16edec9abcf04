"""Two ranks over gloo: the real deepseek_v3 two-block model under FSDP + EP through its own
``parallelize_fn``, compiled with a backend that records every graph Dynamo makes.

Run by ``tests/tt022/test_moe_scope_inspection.py``::

    torchrun --nproc_per_node 2 tests/support/moe_scope_worker.py OUT_DIR

For each case (no compile, the numerics' baseline; ``moe_eager_scope`` ``moe`` without and
with full activation checkpointing; ``block``; TorchTitan's stock MoE compile as the audit's
positive control), each rank:

1. builds the model on meta and converts it with ``rocm.grouped_mm`` (backend ``torch``) and
   ``rocm.moe_eager_compile`` as ``train.py`` does, then runs deepseek_v3's own
   ``parallelize_fn`` with ``ParallelDims(dp_shard=2, ep=2)``: EP's ``distribute_module``
   dispatch/combine on the experts, FSDP (``fully_shard``) per block and on the experts;
2. loads the weights of an unsharded reference (seed 0), runs one forward and backward on its
   own batch, and compares its loss and every gradient (summed over ranks: TorchTitan turns
   FSDP's gradient division off) with the same model run without compile, and with the
   unsharded reference run eagerly on both ranks' batches;
3. writes ``OUT_DIR/rank<r>.json``: per case, every recorded graph's
   :func:`~titan_rocm.testing.graph_audit.audit`, the model parameters
   each graph reads (matched by identity when Dynamo hands the graph over, when FSDP has
   put the unsharded parameters in place), the eager MoE forward counts, and the numerics.

Plus ``control_collective``: a function calling a functional all-gather, compiled with the
same recorder, so the collective detector is shown to fire on a real traced collective.

The recorder hands each graph on to ``aot_eager``: forward and backward run through
AOTAutograd's traced graphs (as under Inductor) with eager kernels, so FP32 results match the
reference to rounding.

CPU stand-ins (test harness only): TorchTitan's parallel dims on the ``cpu`` device type
(``cpu_trainer.cpu_patches``), its permutation index kernel on its own CPU path, ``histc`` on
int64 counted in float (CPU has no int ``histc``), and FSDP's reduce-scatter as a plain sum
(``set_force_sum_reduction_for_comms``: gloo has no ``PREMUL_SUM``; the divide factor
TorchTitan sets is 1, so the sum is what NCCL would compute).
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as a script: tests.support imports need the repo root
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))

import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

RECORDER = "titan_rocm_scope_recorder"
RTOL, ATOL = 1e-4, 1e-6
SEQ_LEN, BATCH = 16, 2
CASES: dict[str, tuple[str, str]] = {
    # name: (moe_eager_compile scope, "stock" or "eager" (no compile), activation checkpointing)
    "eager": ("eager", "none"),
    "moe_scope": ("moe", "none"),
    "moe_scope_ac_full": ("moe", "full"),
    "block_scope": ("block", "none"),
    "stock_moe_compile": ("stock", "none"),
}


class Recorder:
    """A Dynamo backend: keeps each graph's audit and the parameters it reads, then aot_eager."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.graphs: list[dict[str, Any]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._dynamo.backends.registry import lookup_backend

        from titan_rocm.testing.graph_audit import audit

        names: dict[int, str] = {}
        if self.model is not None:
            for name, tensor in [*self.model.named_parameters(), *self.model.named_buffers()]:
                names[id(tensor)] = name.replace("._orig_mod", "").replace(
                    "._checkpoint_wrapped_module", "")
        reads = sorted(names[id(t)] for t in example_inputs if id(t) in names)
        self.graphs.append({**audit(gm).to_dict(), "reads": reads})
        return lookup_backend("aot_eager")(gm, example_inputs)


RECORD = Recorder()
torch._dynamo.register_backend(name=RECORDER)(RECORD)


def cpu_stand_ins() -> None:
    """Let TorchTitan's MoE run on CPU (see the module docstring)."""
    import torchtitan.models.moe.utils as moe_utils

    from tests.support import cpu_trainer

    cpu_trainer.cpu_patches()
    moe_utils.generate_permute_indices = functools.partial(
        moe_utils.generate_permute_indices, use_cpu=True)
    histc = torch.histc

    def histc_any_dtype(input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if input.device.type == "cpu" and not input.is_floating_point():
            return histc(input.float(), *args, **kwargs).to(input.dtype)
        return histc(input, *args, **kwargs)

    torch.histc = histc_any_dtype


def job(scope: str, ac: str) -> Any:
    """The job's config: FSDP 2 x EP 2, FP32 parameters, compile through the recorder."""
    from tests.support.moe_test_models import parse

    mixed = scope in ("block", "moe")
    return parse(
        "--model.name", "deepseek_v3", "--model.flavor", "debugmodel",
        "--training.seq_len", str(SEQ_LEN), "--training.mixed_precision_param", "float32",
        "--activation_checkpoint.mode", ac,
        "--parallelism.data_parallel_shard_degree", "2",
        "--parallelism.expert_parallel_degree", "2",
        *(() if scope == "eager" else ("--compile.enable",)), "--compile.backend", RECORDER,
        "--model.converters", "rocm.grouped_mm,rocm.moe_eager_compile",
        "--rocm.grouped_mm", "on", "--rocm.grouped_mm_backend", "torch",
        "--rocm.moe_eager_compile", "on" if mixed else "off",
        "--rocm.moe_eager_scope", scope if mixed else "block",
    )  # fmt: skip


def reference(args: Any, batches: list[tuple[Any, Any]]) -> tuple[list[float], dict[str, Any]]:
    """The unsharded model, eager: each batch's loss, and the gradients summed over batches."""
    from tests.support.moe_test_models import build_meta, loss_and_grads, materialize

    model = build_meta(job("moe", "none"), args=args)
    materialize(model, seed=0, device="cpu")
    losses = [float(loss_and_grads(model, *batch)[0]) for batch in batches]
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    return losses, {"grads": grads, "state": state}


def _compare(grads: dict[str, Any], against: dict[str, torch.Tensor]) -> tuple[list[str], float]:
    """Parameters whose gradient differs from ``against`` (rtol/atol), and the largest gap."""
    mismatched, worst = [], 0.0
    for param, expected in against.items():
        grad = grads.get(param)
        if grad is None or not torch.allclose(grad, expected, rtol=RTOL, atol=ATOL):
            mismatched.append(param)
        if grad is not None:
            worst = max(worst, float((grad - expected).abs().max()))
    return mismatched, worst


def run_case(name: str, parallel_dims: Any, args: Any, batch: tuple[Any, Any],
             ref_loss: float, ref: dict[str, Any]) -> dict[str, Any]:
    """Parallelize, load the reference weights, one forward+backward; what was compiled.

    The gradients are compared with the same FSDP + EP model run without compile (the
    ``eager`` case, run first): compile is the only difference. Its own comparison with the
    unsharded reference is reported beside it (EP sums the experts' gradients in another
    order: a few 1e-6 apart).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.protocols.train_spec import get_train_spec

    from tests.support.moe_test_models import (
        build_meta,
        clean_patches,
        convert,
        decisions,
        loss_and_grads,
    )
    from titan_rocm.workarounds import moe_blocks
    from titan_rocm.workarounds.grouped_mm import seams_tt022

    scope, ac = CASES[name]
    torch._dynamo.reset()
    RECORD.graphs.clear()
    with clean_patches():
        jc = job(scope, ac)
        model = build_meta(jc, args=args)
        made = decisions(convert(jc, model, parallel_dims))
        get_train_spec("deepseek_v3").parallelize_fn(model, parallel_dims, jc)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=torch.device("cpu"))  # buffers (freqs_cis)
        # set_model_state_dict pops what it loads: hand it a copy.
        set_model_state_dict(model, dict(ref["state"]),
                             options=StateDictOptions(full_state_dict=True, strict=True))
        RECORD.model = model
        loss, grads = loss_and_grads(model, *batch)
        RECORD.model = None
        runner = seams_tt022.bound_runner(moe_blocks.unwrap_block(model.layers["1"]).moe.experts)
        full = {n: (g.full_tensor() if hasattr(g, "full_tensor") else g).detach()
                for n, g in grads.items() if g is not None}
        if name == "eager":
            ref["eager_grads"], ref["eager_loss"] = full, float(loss)
        vs_eager, worst_eager = _compare(full, ref["eager_grads"])
        vs_ref, worst_ref = _compare(full, ref["grads"])
        return {
            "scope": scope, "ac": ac,
            "plan": made["moe_eager_compile"].details.get("blocks"),
            "experts_compile": made["grouped_mm"].details["experts_compile"],
            "runner_compiled": runner.compiled if runner is not None else None,
            "eager_forwards": moe_blocks.eager_forward_calls(),
            "graphs": list(RECORD.graphs),
            "loss": float(loss), "eager_loss": ref["eager_loss"], "ref_loss": ref_loss,
            "grads_compared": len(ref["eager_grads"]),
            "grads_mismatched_vs_eager": vs_eager, "grad_max_abs_diff_vs_eager": worst_eager,
            "grads_mismatched_vs_reference": vs_ref, "grad_max_abs_diff_vs_reference": worst_ref,
        }


def control_collective() -> dict[str, Any]:
    """A real traced collective, through the same recorder: the detector must fire."""
    import torch.distributed._functional_collectives as funcol

    torch._dynamo.reset()
    RECORD.graphs.clear()

    def gather_twice(t: torch.Tensor) -> torch.Tensor:
        return funcol.all_gather_tensor(t * 2, 0, dist.group.WORLD) + 1

    out = torch.compile(gather_twice, backend=RECORDER, fullgraph=True)(torch.ones(2))
    return {"graphs": list(RECORD.graphs), "result": out.tolist()}


def main(out_dir: Path) -> None:
    """Every case on this rank; the results to ``out_dir/rank<r>.json``."""
    from torchtitan.distributed import ParallelDims

    from tests.support.moe_test_models import random_batch, two_block_deepseek_args

    cpu_stand_ins()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    parallel_dims = ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=world,
                                 etp=1, world_size=world)
    parallel_dims.build_mesh()
    args = two_block_deepseek_args(job("moe", "none"))
    batches = []
    for r in range(world):
        tokens, labels = random_batch(args.vocab_size, BATCH, SEQ_LEN, "cpu")
        # A different batch per rank: EP really exchanges tokens between them.
        batches.append(((tokens + 97 * r) % args.vocab_size, (labels + 31 * r) % args.vocab_size))
    ref_losses, ref = reference(args, batches)
    results: dict[str, Any] = {"rank": rank, "world": world}
    for name in CASES:
        results[name] = run_case(name, parallel_dims, args, batches[rank], ref_losses[rank], ref)
    results["control_collective"] = control_collective()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, indent=1, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main(Path(sys.argv[1]))
