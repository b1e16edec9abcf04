"""``titan-rocm tune collect``: one step of the job's own trainer, recording every GEMM problem it
lowers, so the problems are exactly training's (docs/validated-tuning.md)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from titan_rocm.files import write_atomic
from titan_rocm.settings import RocmSettings
from titan_rocm.tuned_gemms import problems as problems_module
from titan_rocm.tuned_gemms.problems import Problem

MERGE_WAIT_S = 600.0

NO_GEMM = ("compile.enable is false (or 'model' is not in compile.components): the job "
           "compiles no GEMM, there is nothing to tune")


class CollectError(ValueError):
    """The job cannot be collected; the message says why (exit 2)."""


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


def has_accelerator() -> bool:
    """Whether torch sees a GPU (CUDA or ROCm) here."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator.is_available() if accelerator is not None
                else torch.cuda.is_available())


def no_device(trainer: str, advice: str = "") -> str:
    """The sentence refusing ``trainer`` on a machine without a GPU, with ``advice`` if any."""
    return (f"this machine has no GPU (torch sees no accelerator), and {trainer} trains on "
            f"CUDA/ROCm: run tune collect on a GPU node of the cluster{advice} "
            "(docs/validated-tuning.md, \"Without a GPU\")")


def train(build: Callable[[], Any]) -> None:
    """Build and train as ``torchtitan.train.main`` does: ``close()`` even when training raises."""
    import torch

    trainer = build()
    try:
        trainer.train()
    except BaseException:
        trainer.close()
        raise
    trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def record(step: Callable[[], None], job: dict[str, Any], settings: RocmSettings,
           output: Path) -> int:
    """Run ``step`` recording every GEMM lowered, write the problems; return the exit code.
    CollectError when no GEMM was lowered or the ranks' parts cannot merge."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    from titan_rocm.tuned_gemms.choices import ChoicesFactory, RecordingChoices, install
    from titan_rocm.tuned_gemms.env import environment

    found: list[Problem] = []
    inductor_config.fx_graph_cache = False  # a cached graph is never lowered: nothing recorded
    if hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = False
    install(ChoicesFactory(lambda: RecordingChoices(found.append)))
    step()

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    head = problems_module.header(
        {**job, "world_size": world}, environment(), asdict(settings),
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
