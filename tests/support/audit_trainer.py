"""The CPU trainer the audit tests build: the package's ``titan-rocm audit --trainer
cpu-tiny`` (titan_rocm/adapters/tt022/cpu_trainer.py: TorchTitan 0.2.2's real trainer,
parallelised and compiled by the model's own ``parallelize_fn``, Inductor's CPU backend),
for in-process tests.

At import it lets TorchTitan's MoE run on CPU (its token counting and padding are GPU-only),
process-wide: this module is only ever imported by the audit tests' own processes and cases.

Faults come from titan-rocm's own injector (``TITAN_ROCM_DEBUG_CORRUPT``, compiled code only;
docs/numerics-audit-fault.md), installed on the built model when the variable is set.
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as a script: tests.support imports need the repo root
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))

import sys
from collections.abc import Sequence
from typing import Any

import torch

from titan_rocm.adapters.tt022.cpu_trainer import TINY, TinyCpuTrainer, cpu_patches

# TorchTitan's MoE on CPU for the whole process (the package's CPU trainer does it at build;
# the in-process tests build the model before any trainer): only the audit tests' own
# processes and cases import this module.
cpu_patches()


COMPILED_CALLS: list[int] = [0]
"""Calls of compiled graphs made by the ``audit_counting`` backend (Inductor, counted)."""


def _counting_backend(gm: Any, example_inputs: Any) -> Any:
    from torch._inductor.compile_fx import compile_fx

    compiled = compile_fx(gm, example_inputs)

    def run(*args: Any) -> Any:
        COMPILED_CALLS[0] += 1
        return compiled(*args)

    return run


if "audit_counting" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(_counting_backend, name="audit_counting")


class AuditTrainer(TinyCpuTrainer):
    """The package's tiny CPU trainer (``titan-rocm audit --trainer cpu-tiny``: the job's
    ParallelDims and the model's own ``parallelize_fn``); with ``TITAN_ROCM_DEBUG_CORRUPT``
    set, the test fault installed on the built model (a test harness installs it for the
    in-process audits; training never does)."""

    def __init__(self, job_config: Any) -> None:
        super().__init__(job_config)
        from titan_rocm.testing import corrupt

        corrupt.install(self.model_parts)


__all__ = ["TINY", "AuditTrainer"]


LLAMA = ["--model.name", "llama3", "--model.flavor", "debugmodel"]
QWEN = ["--model.name", "qwen3", "--model.flavor", "debugmodel"]
DEEPSEEK = ["--model.name", "deepseek_v3", "--model.flavor", "debugmodel"]
MODELS = {"llama3": LLAMA, "qwen3": QWEN, "deepseek_v3": DEEPSEEK}
COMPILED = ["--model.converters", "rocm", "--compile.enable",
            "--activation_checkpoint.mode", "none"]


def build(args: list[str], layers: int | None = None) -> tuple[Any, Any]:
    """An AuditTrainer of ``cpu_trainer.job_config(COMPILED + args)`` in this process
    (``layers`` blocks: None keeps the harness's two), and its job config."""
    from tests.support.cpu_trainer import job_config

    jc = job_config(COMPILED + list(args))
    torch._dynamo.reset()
    cls = AuditTrainer if layers is None else type("AuditTrainer", (AuditTrainer,),
                                                    {"n_layers": layers})
    return cls(jc), jc


def batch(trainer: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The trainer's next micro-batch."""
    return next(iter(trainer.dataloader))


def audit(trainer: Any, jc: Any, input_dict: Any = None, labels: Any = None,
          tokens: int | None = None, chunks: int | None = None) -> Any:
    """The audit of one micro-batch (the first one by default), as ``titan-rocm audit`` runs
    it on a built trainer; asserts the trainer's state is left as it was."""
    from titan_rocm.adapters.tt022.audit import audit_built
    from titan_rocm.adapters.tt022.config import settings_from

    if input_dict is None:
        input_dict, labels = batch(trainer)
    model = trainer.model_parts[0]
    before = [b.clone() for b in model.buffers()], torch.get_rng_state()
    grads = [p.grad for p in model.parameters()]
    result = audit_built(trainer, settings_from(jc), input_dict, labels, tokens, chunks)
    # What the audit must leave as it found it (the MoE token counts are buffers).
    assert all(torch.equal(a, b) for a, b in zip(before[0], model.buffers(), strict=True))
    assert torch.equal(before[1], torch.get_rng_state())
    assert all(p.grad is g for p, g in zip(model.parameters(), grads, strict=True))
    return result


def audit_job(args: list[str], tokens: int | None = None, chunks: int | None = None,
              layers: int | None = None) -> Any:
    """Build the trainer of ``args`` and audit its first micro-batch."""
    trainer, jc = build(args, layers)
    return audit(trainer, jc, tokens=tokens, chunks=chunks)


def reseed(trainer: Any, seed: int) -> None:
    """New weights (the model's own init under ``seed``) and a new first batch: a clean run
    of another seed without compiling again (the compiled graphs take the weights as
    inputs)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        trainer.model_parts[0].init_weights(buffer_device=None)
    trainer.dataloader.seed = 1000 + seed
    trainer.dataloader.position = 0


def matrix(model: str, seeds: int = 5, layers: int = 3) -> list[Any]:
    """The detection matrix on the 0.2.2 trainer of ``model`` (compiled once): clean audits
    over ``seeds`` seeds, then each fault of titan_rocm.testing.audit_matrix at the first, a
    middle and the last block."""
    from titan_rocm.testing import audit_matrix

    trainer, jc = build(MODELS[model], layers)
    audit_matrix.install(trainer.model_parts)
    keys = [k for k, _ in trainer.model_parts[0].layers.named_children()]
    specs = audit_matrix.fault_specs(audit_matrix.first_middle_last(keys))
    return audit_matrix.run(lambda: audit(trainer, jc).to_dict(), specs, list(range(seeds)),
                            lambda seed: reseed(trainer, seed))


def submodule_matrix(model: str, layers: int = 3,
                     sites: Sequence[Any] | None = None) -> list[Any]:
    """Each site of titan_rocm.testing.audit_matrix.SITES at 0.5 % in the first, a middle and
    the last block, forward and backward: each must be named at its block and child. A site
    is a new fault op, so the model compiles again for each."""
    from titan_rocm.testing import audit_matrix, corrupt

    outcomes: list[Any] = []
    for site in sites or audit_matrix.SITES[model]:
        corrupt.uninstall()
        # A site no module names sits in a child compiled alone: stock MoE compile.
        stock = ["--rocm.moe_eager_compile", "off"] if site.module is None else []
        trainer, jc = build(MODELS[model] + stock, layers)
        audit_matrix.install(trainer.model_parts, site.op, site.index, site.module)
        specs = site.specs(site.blocks(trainer.model_parts))
        outcomes += audit_matrix.run(lambda trainer=trainer, jc=jc: audit(trainer, jc).to_dict(),
                                     specs, [], lambda seed: None, child=site.child)
        trainer.close()
    corrupt.uninstall()
    return outcomes


if __name__ == "__main__":
    # The CPU matrices docs/numerics-audit.md quotes:
    #   python tests/support/audit_trainer.py [seeds]        the blocks' detection matrix
    #   python tests/support/audit_trainer.py --submodules   inside a block (its SITES)
    import json

    import titan_rocm  # noqa: F401
    from titan_rocm.testing import audit_matrix

    if sys.argv[1:] == ["--submodules"]:
        for name, sites in audit_matrix.SITES.items():
            # The experts' grouped GEMM is compiled on a GPU only (0.2.2's run eager on CPU).
            outcomes = submodule_matrix(name, sites=[s for s in sites if s.op != "_grouped_mm"])
            wrong = [o.to_dict() for o in outcomes if not o.judged["right"]]
            print(json.dumps({"model": name, "audits": len(outcomes), "wrong": wrong}),
                  flush=True)
        sys.exit(0)
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for name in MODELS:
        outcomes = matrix(name, seeds)
        wrong = [o.to_dict() for o in outcomes if not o.judged["right"]]
        print(json.dumps({"model": name, "audits": len(outcomes), "wrong": wrong}), flush=True)
