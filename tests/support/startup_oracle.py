"""TorchTitan 0.2.2's real start-up on a CPU machine: the oracle for ``titan-rocm plan``.

Runs the real ``torchtitan.train`` entry point (``python -m torchtitan.train``) or titan-rocm's
launcher (``titan_rocm.train.main``) on a job, unchanged, with three CPU stand-ins:
TorchTitan's fake process group (``--comm.mode fake_backend``, ``NGPU`` ranks, rank 0, a
fixed ``--debug.seed``), ``torch.cuda.set_device`` and DTensor's RNG seeding as no-ops, and
a memory monitor that reads nothing. When start-up
reaches the model's ``parallelize_fn`` (or ``pipelining_fn``) -- past the config, the
``custom_import``, ``ParallelDims`` and its device mesh, the train spec, the model, every model
converter and the batch-size checks -- it prints ``STARTUP-OK`` and exits 0. Any failure
before that is TorchTitan's own traceback and a non-zero exit::

    python tests/support/startup_oracle.py torchtitan WORLD_SIZE --job.config_file X.toml ...
    python tests/support/startup_oracle.py titan-rocm WORLD_SIZE --job.config_file X.toml ...

``python tests/support/startup_oracle.py meshes < cases.json`` answers, for each ``[world_size,
{dp_replicate, dp_shard, cp, tp, pp, ep, etp}]``, whether TorchTitan's ``ParallelDims`` accepts
the degrees and builds its device mesh on a fake process group of that size (a JSON list of
booleans on stdout).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import runpy
import sys
from types import ModuleType
from typing import Any

REACHED = "STARTUP-OK"


class _NoMemoryMonitor:
    device_name = "CPU (titan-rocm start-up oracle)"

    def get_peak_stats(self) -> Any:
        from torchtitan.components.metrics import DeviceMemStats

        return DeviceMemStats(0, 0.0, 0, 0.0, 0, 0)

    def reset_peak_stats(self) -> None:
        """Nothing to reset."""


def _reached(*_args: Any, **_kwargs: Any) -> None:
    print(REACHED, flush=True)
    sys.stderr.flush()
    os._exit(0)


def _patch_metrics(module: ModuleType) -> None:
    module.build_device_memory_monitor = _NoMemoryMonitor


def _patch_train_spec(module: ModuleType) -> None:
    real = module.get_train_spec

    def get_train_spec(name: str) -> Any:
        spec = real(name)
        return dataclasses.replace(
            spec,
            parallelize_fn=_reached,
            pipelining_fn=_reached if spec.pipelining_fn else None,
        )

    module.get_train_spec = get_train_spec


PATCHES = {
    "torchtitan.components.metrics": _patch_metrics,
    "torchtitan.protocols.train_spec": _patch_train_spec,
}


def meshes() -> None:
    """Answer ``meshes`` mode (see the module docstring)."""
    import json

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.distributed import ParallelDims

    verdicts = []
    for world, degrees in json.load(sys.stdin):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        try:
            ParallelDims(world_size=world, **degrees).build_mesh()
            verdicts.append(True)
        except (AssertionError, ValueError, RuntimeError):
            verdicts.append(False)
        finally:
            dist.destroy_process_group()
    print(json.dumps(verdicts))


def main() -> None:
    """``startup_oracle.py LAUNCHER WORLD_SIZE ARGS...`` or ``startup_oracle.py meshes``."""
    import torch

    if sys.argv[1] == "meshes":
        meshes()
        return
    launcher, world, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.environ.update(NGPU=world, RANK="0", LOCAL_RANK="0", WORLD_SIZE=world,
                      LOCAL_WORLD_SIZE=world)
    torch.cuda.set_device = lambda *_a, **_k: None
    # DTensor's RNG tracker needs a CUDA device; seeding is no start-up check.
    import torch.distributed.tensor._random as dtensor_random

    dtensor_random.manual_seed = lambda *_a, **_k: None
    # A set seed keeps set_determinism from moving an RNG state to the (absent) GPU.
    args = [*args, "--comm.mode", "fake_backend", "--debug.seed", "0"]
    sys.path.insert(0, os.getcwd())  # as `python -m` does
    if launcher == "titan-rocm":
        from titan_rocm._after_import import AfterImport
        from titan_rocm.adapters.tt022.train import main as launch

        for name, patch in PATCHES.items():
            AfterImport(name, patch).arm()
        sys.argv = ["titan-rocm-train", *args]
        launch(args)
    else:
        # ConfigManager.parse_args binds sys.argv[1:] when first imported: set it first.
        sys.argv = ["torchtitan.train", *args]
        for name, patch in PATCHES.items():
            patch(importlib.import_module(name))
        runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
    print("start-up ended without reaching parallelize_fn", file=sys.stderr)
    sys.exit(3)


if __name__ == "__main__":
    main()
