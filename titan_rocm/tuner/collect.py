"""``titan-rocm tune collect``: one step of the job, recording every GEMM problem it lowers.

It runs TorchTitan's own trainer (forward and backward, the real model, the real parallelism
on each rank) for one step with :class:`~titan_rocm.tuned_gemms.choices.RecordingChoices`
installed: Triton templates are offered (``max_autotune_gemm``, backends ATEN,TRITON) and
recorded, but every GEMM compiles with its ATen kernel, so nothing is benchmarked. Caches
that would skip lowering (FX graph, AOT autograd) are off. The job's titan-rocm workarounds
apply as in training; ``rocm.gemm_lookup`` is turned off for the step.

Under torchrun each rank writes its part; rank 0 merges them into ``-o``. Without torchrun it
runs as one process with the environment ``titan-rocm-train`` gives (``RANK=0``,
``WORLD_SIZE=1``, a free ``MASTER_PORT``, ...).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from titan_rocm.adapters.tt022.job_args import JobArgsError, prepare
from titan_rocm.files import write_atomic
from titan_rocm.tuned_gemms import problems as problems_module
from titan_rocm.tuned_gemms.problems import Problem

STEP_FLAGS: tuple[str, ...] = (
    "--training.steps", "1", "--checkpoint.no-enable", "--rocm.gemm_lookup", "off",
)
"""Appended to the job's flags: one step, no checkpoint, no table."""

MERGE_WAIT_S = 600.0

DEFAULT_TRAINER = "torchtitan.train:Trainer"
"""TorchTitan's own trainer, which puts the model on CUDA/ROCm (``device_module.set_device``
in its ``__init__``, TorchTitan 0.2.2 ``torchtitan/train.py``)."""


class CollectError(ValueError):
    """The job cannot be collected; the message says why (exit 2)."""


def _trainer_class(spec: str) -> type:
    module_name, sep, name = spec.partition(":")
    if not sep:
        raise CollectError(f"--trainer {spec!r}: expected MODULE:CLASS")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise CollectError(f"--trainer {spec!r}: cannot import ({exc})") from None


def _part(output: Path, rank: int, world: int) -> Path:
    return output.with_name(f".{output.name}.rank{rank}-of-{world}.part")


def _merge(output: Path, world: int) -> list[Problem]:
    parts = [_part(output, r, world) for r in range(world)]
    deadline = time.monotonic() + MERGE_WAIT_S
    while not all(p.exists() for p in parts):
        if time.monotonic() > deadline:
            missing = [str(p) for p in parts if not p.exists()]
            raise CollectError(f"ranks' parts missing after {MERGE_WAIT_S}s: {missing} "
                               "(is -o on a file system every rank can write?)")
        time.sleep(1)
    found: list[Problem] = []
    for part in parts:
        found += problems_module.read(part).problems
    for part in parts:
        part.unlink()
    return problems_module.merge(found)


def _no_device_reason(trainer: str) -> str | None:
    """Why TorchTitan's own trainer cannot run here (no GPU), or None. A trainer of the
    user's (``--trainer``) may run on CPU, as the tests' does: it is not judged."""
    if trainer != DEFAULT_TRAINER:
        return None
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator.is_available() if accelerator is not None else torch.cuda.is_available():
        return None
    return ("this machine has no GPU (torch sees no accelerator), and TorchTitan's trainer "
            "trains on CUDA/ROCm: run tune collect on a GPU node of the cluster, or name a "
            "trainer class that runs on CPU with --trainer MODULE:CLASS (docs/"
            "validated-tuning.md, \"Without a GPU\")")


def collect(args: Sequence[str], output: Path, trainer: str = DEFAULT_TRAINER) -> int:
    """Run one step of the job in ``args`` (TorchTitan flags) and write its problems.

    Raises:
        CollectError: not TorchTitan 0.2.x, bad arguments, TorchTitan's trainer on a
            machine without a GPU, compile disabled, or no GEMM lowered.
    """
    from titan_rocm import torchtitan_version

    try:  # its flags and trainer are 0.2.x's (ConfigManager, train.main); read from files
        torchtitan_version.require("0.2", "tune collect",
                                   advice="run it in an environment with torchtitan 0.2.2")
    except torchtitan_version.TorchTitanVersionError as exc:
        raise CollectError(str(exc)) from None
    if "torchtitan.config.manager" in sys.modules:
        raise CollectError("tune collect must run before torchtitan.config is imported")
    try:
        prepared = prepare(list(args)) + list(STEP_FLAGS)
    except JobArgsError as exc:
        raise CollectError(str(exc)) from None
    if reason := _no_device_reason(trainer):  # before TorchTitan loads: a sentence, not a trace
        raise CollectError(reason)
    from titan_rocm.adapters.common import LaunchError, single_process_environment

    try:  # one process without torchrun, as titan-rocm-train (TorchTitan reads LOCAL_RANK)
        added = single_process_environment()
    except LaunchError as exc:
        raise CollectError(str(exc)) from None
    if added:
        print(f"titan-rocm tune: no torchrun environment: one process (RANK=0, WORLD_SIZE=1, "
              f"MASTER_PORT={os.environ['MASTER_PORT']}), as torchrun --standalone "
              "--nproc_per_node=1 would start it", file=sys.stderr)
    sys.argv = ["titan-rocm-tune-collect", *prepared]  # TorchTitan's main() parses sys.argv
    from torchtitan.config import ConfigManager

    import titan_rocm  # noqa: F401 - registers the converters

    try:
        job = ConfigManager().parse_args(prepared)
    except SystemExit as exc:
        raise CollectError(f"TorchTitan rejected the arguments (exit {exc.code})") from None
    except (ValueError, TypeError, AssertionError) as exc:
        raise CollectError(str(exc)) from None
    if not job.compile.enable or "model" not in job.compile.components:
        raise CollectError("[compile] enable = false (or 'model' not in components): the job "
                           "compiles no GEMM, there is nothing to tune")
    trainer_cls = _trainer_class(trainer)

    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    from titan_rocm.adapters.tt022.config import settings_from
    from titan_rocm.tuned_gemms.choices import ChoicesFactory, RecordingChoices, install
    from titan_rocm.tuned_gemms.env import environment

    found: list[Problem] = []
    inductor_config.fx_graph_cache = False  # a cached graph is never lowered: nothing recorded
    if hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = False
    install(ChoicesFactory(lambda: RecordingChoices(found.append)))
    from torchtitan.train import main as train_main

    train_main(trainer_cls)

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    user_args = [a for a in args]
    head = problems_module.header(
        {"config_file": job.job.config_file, "model": job.model.name,
         "flavor": job.model.flavor, "args": user_args, "world_size": world},
        environment(), asdict(settings_from(job)),
        datetime.now(timezone.utc).isoformat(timespec="seconds"))
    merged = problems_module.merge(found)
    if world > 1:
        write_atomic(_part(output, rank, world), problems_module.dumps(head, merged))
        if rank != 0:
            return 0
        merged = _merge(output, world)
    if not merged:
        raise CollectError("the step lowered no GEMM through Inductor (is the model compiled? "
                           "are its matmuls inside the compiled region?)")
    write_atomic(output, problems_module.dumps(head, merged))
    print(json.dumps({"problems": len(merged), "output": str(output),
                      "lowerings": sum(p.count for p in merged)}))
    return 0
