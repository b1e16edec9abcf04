"""TorchTitan 0.2.2's real trainer without a GPU, for ``titan-rocm audit --trainer cpu`` and
``cpu-tiny`` (docs/numerics-audit.md).

``Trainer.__init__`` is CUDA-bound (``torch.device("cuda:N")``, NCCL, a CUDA memory monitor),
so :class:`CpuTrainer` replaces only ``__init__``; everything after is TorchTitan's code.
Random tokens suffice: the audit judges compiled against eager on any batch."""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.train import Trainer

from titan_rocm.adapters.common import CpuMemoryMonitor, single_process_environment

TINY: dict[str, int] = {"dim": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256}
MODEL_TINY: dict[str, dict[str, int]] = {
    # qwen3's debugmodel has 8 kv heads of 128 and a 3072 FFN: tiny GQA (2 kv heads of 16).
    "qwen3": {"n_kv_heads": 2, "head_dim": 16, "hidden_dim": 128},
}
"""Per model, what TINY needs besides to stay a consistent tiny model."""


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


def cpu_histc(set_attr: Callable[..., Any] = setattr) -> None:
    """CPU has no int64 ``torch.histc``: count in float and return the input's dtype, as the GPU
    kernel does."""
    if getattr(torch.histc, "__name__", "") == "histc_any_dtype":  # already counting on CPU
        return
    # The aten op, not the saved builtin: Dynamo maps torch's builtins by their names in
    # ``torch``, and once ``torch.histc`` is this function the saved builtin has no name there
    # (a compiled MoE block then fails "function marked as skipped").
    histc = torch.ops.aten.histc

    def histc_any_dtype(input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if input.device.type == "cpu" and not input.is_floating_point():
            return histc(input.float(), *args, **kwargs).to(input.dtype)
        return histc(input, *args, **kwargs)

    set_attr(torch, "histc", histc_any_dtype)


def cpu_permute_indices(set_attr: Callable[..., Any], moe_module: types.ModuleType) -> None:
    """TorchTitan's MoE padding wrapper on its own ``use_cpu=True`` path (its default is Triton)."""
    utils = sys.modules[moe_module.indices_padding_wrapper.__module__]
    current = utils.generate_permute_indices
    if isinstance(current, functools.partial) and current.keywords.get("use_cpu"):
        return
    set_attr(utils, "generate_permute_indices", functools.partial(current, use_cpu=True))


def cpu_patches(set_attr: Callable[..., Any] = setattr) -> None:
    """Point TorchTitan's CUDA-only helpers at CPU (tests pass ``monkeypatch.setattr``)."""
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.models.moe.moe as moe_module

    set_attr(parallel_dims, "device_type", "cpu")
    set_attr(metrics, "build_device_memory_monitor", CpuMemoryMonitor)
    set_attr(dist_utils, "set_pg_timeouts", lambda *args, **kwargs: None)
    cpu_histc(set_attr)
    cpu_permute_indices(set_attr, moe_module)


def init_process_group() -> None:
    """gloo group from torchrun's environment, or a one-rank group."""
    if dist.is_initialized():
        return
    single_process_environment()
    dist.init_process_group("gloo")


def _data_rank(parallel_dims: Any, rank: int) -> int:
    """The ranks of one TP (and CP) group must read the same batch."""
    inner = parallel_dims.cp * parallel_dims.tp
    return (rank // inner) % (parallel_dims.dp_replicate * parallel_dims.dp_shard)


class CpuTrainer(Trainer):
    """A real TorchTitan 0.2.2 ``Trainer`` assembled on CPU with the job's own model."""

    data_batches: int | None = None
    """None: endless."""
    patch_for_cpu = True

    def model_overrides(self, model_name: str) -> dict[str, int]:
        """Model arguments replaced in the job's flavor (none: the job's own model)."""
        return {}

    def __init__(self, job_config: Any) -> None:  # noqa: PLR0915 - mirrors Trainer.__init__
        from torchtitan.components.checkpoint import CheckpointManager
        from torchtitan.components.metrics import build_metrics_processor
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
        self.parallel_dims = parallel_dims = self.parallel_dims_for(job_config, world)
        self.gc_handler = utils.GarbageCollection(gc_freq=job_config.training.gc_freq)
        torch.manual_seed(job_config.debug.seed or 0)
        self.train_spec = train_spec_module.get_train_spec(job_config.model.name)
        self.tokenizer = None
        seq_len = job_config.training.seq_len
        model_args = self.train_spec.model_args[job_config.model.flavor]
        overrides = self.model_overrides(job_config.model.name)
        if overrides:
            model_args = replace(model_args, **overrides)
        model_args.update_from_config(job_config)
        self.model_args = model_args
        self.dataloader = SyntheticLoader(
            job_config.training.local_batch_size, seq_len, model_args.vocab_size,
            self.data_batches, seed=_data_rank(parallel_dims, dist.get_rank()),
        )
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
        from torchtitan.distributed import ParallelDims

        p = job_config.parallelism
        dims = ParallelDims(
            dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
            cp=p.context_parallel_degree, tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree, ep=p.expert_parallel_degree,
            etp=p.expert_tensor_parallel_degree, world_size=world,
        )
        if world > 1:
            dims.build_mesh()
        return dims

    def parallelize(self, model: Any) -> None:
        """The model's own ``parallelize_fn``, between the converters and ``to_empty``, as
        ``Trainer.__init__`` runs it."""
        from torch.distributed.fsdp import FSDPModule

        self.train_spec.parallelize_fn(model, self.parallel_dims, self.job_config)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # gloo has no PREMUL_SUM; TorchTitan's divide factor is 1, so a plain sum is
                # what NCCL computes.
                module.set_force_sum_reduction_for_comms(True)


class TinyCpuTrainer(CpuTrainer):
    """:class:`CpuTrainer` cut to :data:`TINY` (two blocks, 64 wide): an audit in seconds."""

    n_layers: int | None = None
    """None: TINY's."""

    def model_overrides(self, model_name: str) -> dict[str, int]:
        tiny = {**TINY, **MODEL_TINY.get(model_name, {})}
        if self.n_layers is not None:
            tiny["n_layers"] = self.n_layers
        return tiny
