"""TorchTitan 0.2.2's real ``Trainer.train()`` and ``train_step`` on CPU, with a tiny llama3.

``Trainer.__init__`` is CUDA-bound (``torch.device("cuda:N")``, NCCL, a CUDA memory
monitor), so :class:`CpuTrainer` replaces only ``__init__``: it assembles the same real
components in the same order (model on meta, model converters, ``MetricsProcessor``, loss
function from the train spec, optimizers, LR schedulers, the post-optimizer hook,
``CheckpointManager``) on CPU with a gloo process group. Everything after that is
TorchTitan's own code: ``train()``, ``train_step()``, ``forward_backward_step()``,
``clip_grad_norm_``, ``MetricsProcessor.log``, ``CheckpointManager.save`` and ``main()``.

CPU stand-ins (nothing else is replaced): a memory monitor reporting this process's peak
RSS (``torch.cuda`` memory stats do not exist on CPU), a synthetic token loader, no AMP,
model not wrapped for data parallelism, and ``set_pg_timeouts`` (a CUDA barrier) skipped.

Run as a program, it is ``torchtitan.train.main(CpuTrainer)``: the exit code is TorchTitan's::

    python tests/support/cpu_trainer.py --model.converters rocm.divergence_guard --training.steps 12
    torchrun --nproc_per_node 2 tests/support/cpu_trainer.py ...     # two ranks over gloo
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as a script: tests.support imports need the repo root
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from tests.support.cpu_support import CpuMemoryMonitor, default_rank_env

TINY = {"dim": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256}
MODEL_TINY: dict[str, dict[str, int]] = {
    # qwen3's debugmodel has 8 kv heads of 128 and a 3072 FFN: tiny GQA (2 kv heads of 16).
    "qwen3": {"n_kv_heads": 2, "head_dim": 16, "hidden_dim": 128},
}
"""Per model, what TINY needs besides to stay a consistent tiny model."""


def _data_rank(parallel_dims: Any, rank: int) -> int:
    """The data-parallel index of ``rank`` in TorchTitan's (pp, batch, cp, tp) mesh: the ranks
    of one TP (and CP) group must read the same batch."""
    inner = parallel_dims.cp * parallel_dims.tp
    return (rank // inner) % (parallel_dims.dp_replicate * parallel_dims.dp_shard)


class SyntheticLoader:
    """Deterministic random tokens: ``(input_dict, labels)`` batches, checkpointable."""

    def __init__(self, batch: int, seq_len: int, vocab: int, batches: int | None, seed: int):
        self.batch, self.seq_len, self.vocab, self.batches = batch, seq_len, vocab, batches
        self.seed = seed
        self.position = 0

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while self.batches is None or self.position < self.batches:
            g = torch.Generator().manual_seed(self.seed * 100_003 + self.position)
            tokens = torch.randint(0, self.vocab, (self.batch, self.seq_len + 1), generator=g)
            self.position += 1
            yield {"input": tokens[:, :-1]}, tokens[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


def cpu_patches(set_attr: Any = setattr) -> None:
    """Point TorchTitan's CUDA-only helpers at CPU (test harness only).

    Tests pass ``monkeypatch.setattr`` so the changes are undone after each test.
    """
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils

    set_attr(parallel_dims, "device_type", "cpu")
    set_attr(metrics, "build_device_memory_monitor", CpuMemoryMonitor)
    set_attr(dist_utils, "set_pg_timeouts", lambda *args, **kwargs: None)


def init_process_group() -> None:
    """gloo group from torchrun's env, or a one-rank group."""
    if dist.is_initialized():
        return
    default_rank_env()
    dist.init_process_group("gloo")


def _trainer_base() -> type:
    from torchtitan.train import Trainer

    return Trainer


class CpuTrainer(_trainer_base()):  # type: ignore[misc]
    """A real TorchTitan ``Trainer`` assembled on CPU (see the module docstring)."""

    data_batches: int | None = None
    """Batches the synthetic loader yields (None: endless)."""
    patch_for_cpu = True
    """Apply :func:`cpu_patches` for good (the program); tests apply them themselves."""
    n_layers: int | None = None
    """Blocks of the tiny model (None: TINY's)."""

    def __init__(self, job_config: Any) -> None:  # noqa: PLR0915 - mirrors Trainer.__init__
        from torchtitan.components.checkpoint import CheckpointManager
        from torchtitan.components.metrics import build_metrics_processor
        from torchtitan.distributed import ParallelDims
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.protocols import train_spec as train_spec_module
        from torchtitan.protocols.model_converter import build_model_converters
        from torchtitan.tools import utils

        if self.patch_for_cpu:
            cpu_patches()
        init_process_group()
        self.job_config = job_config
        self.device = torch.device("cpu")
        world = dist.get_world_size()
        self.parallel_dims = parallel_dims = self.parallel_dims_for(
            job_config, world
        ) or ParallelDims(
            dp_replicate=world, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=world
        )
        self.gc_handler = utils.GarbageCollection(gc_freq=job_config.training.gc_freq)
        torch.manual_seed(job_config.debug.seed or 0)
        self.train_spec = train_spec_module.get_train_spec(job_config.model.name)
        self.tokenizer = None
        seq_len = job_config.training.seq_len
        self.dataloader = SyntheticLoader(
            job_config.training.local_batch_size, seq_len, TINY["vocab_size"],
            self.data_batches, seed=_data_rank(parallel_dims, dist.get_rank()),
        )
        tiny = {**TINY, **MODEL_TINY.get(job_config.model.name, {})}
        if self.n_layers is not None:
            tiny["n_layers"] = self.n_layers
        model_args = replace(self.train_spec.model_args[job_config.model.flavor], **tiny)
        model_args.update_from_config(job_config)
        self.model_args = model_args
        with torch.device("meta"):
            model = self.train_spec.model_cls(model_args)
        model_converters = build_model_converters(job_config, parallel_dims)
        model_converters.convert(model)
        self.model_converters = model_converters
        self.parallelize(model)
        self.metrics_processor = build_metrics_processor(job_config, parallel_dims, model_args)
        _, self.metrics_processor.num_flops_per_token = model_args.get_nparams_and_flops(
            model, seq_len
        )
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        self.model_parts = [model]
        self.loss_fn = self.train_spec.build_loss_fn(job_config, parallel_dims=parallel_dims)
        self.gradient_accumulation_steps = max(
            1, job_config.training.global_batch_size // (job_config.training.local_batch_size
                                                         * world)
        )
        self.optimizers = self.train_spec.build_optimizers_fn(
            self.model_parts, job_config.optimizer, parallel_dims
        )
        self.lr_schedulers = self.train_spec.build_lr_schedulers_fn(
            self.optimizers, job_config.lr_scheduler, job_config.training.steps
        )
        self.optimizers.register_step_post_hook(
            lambda *args, **kwargs: model_converters.post_optimizer_hook(self.model_parts)
        )
        self.metrics_processor.optimizers = self.optimizers
        self.metrics_processor.model_parts = self.model_parts
        self.step = 0
        self.ntokens_seen = 0
        self.checkpointer = CheckpointManager(
            dataloader=self.dataloader,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self},
            checkpoint_config=job_config.checkpoint,
            sd_adapter=None,
            base_folder=job_config.job.dump_folder,
        )
        self.train_context = dist_utils.get_train_context(False)
        self.maybe_enable_amp = contextlib.nullcontext()

    def parallel_dims_for(self, job_config: Any, world: int) -> Any:
        """The job's ParallelDims (None: plain data parallel over every rank, unwrapped)."""
        return None

    def parallelize(self, model: Any) -> None:
        """Between the converters and ``to_empty``, where TorchTitan parallelises (none)."""


BASE_ARGS: list[str] = [
    "--job.custom_config_module", "titan_rocm.config",
    "--model.name", "llama3", "--model.flavor", "debugmodel",
    "--training.local_batch_size", "2", "--training.seq_len", "32",
    "--metrics.log_freq", "10", "--training.steps", "12",
    "--lr_scheduler.warmup_steps", "2", "--checkpoint.no-enable",
]


def job_config(args: list[str]) -> Any:
    """A TorchTitan JobConfig (with titan-rocm's ``[rocm]`` section) from CLI-style args."""
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(BASE_ARGS + list(args))


if __name__ == "__main__":
    from torchtitan.config import ConfigManager
    from torchtitan.train import main

    import titan_rocm  # noqa: F401 - registers the rocm converters

    # ConfigManager.parse_args binds sys.argv[1:] as its default when torchtitan is first
    # imported (above), so hand main() a manager that parses the harness defaults too.
    _parse = ConfigManager.parse_args
    ConfigManager.parse_args = lambda self, args=None: _parse(  # type: ignore[method-assign]
        self, BASE_ARGS + sys.argv[1:] if args is None else args
    )
    main(CpuTrainer)
