"""Helpers for the MoE workaround tests: TorchTitan 0.2.2 models on meta, converters, cleanup."""

from __future__ import annotations

import contextlib
import copy
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

import titan_rocm.adapters.tt022.converters  # noqa: F401  (registers the converters with TorchTitan)
from titan_rocm.workarounds import grouped_mm, moe_blocks
from titan_rocm.workarounds.grouped_mm import seams_tt022 as grouped_mm_tt022
from titan_rocm.workarounds.moe_eager_compile import seams_tt022

MODELS = ("llama3", "llama4", "qwen3", "deepseek_v3", "gpt_oss")


def parse(*argv: str) -> Any:
    """A job config parsed by TorchTitan's own ConfigManager, with ``[rocm]`` merged."""
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(["--job.custom_config_module", "titan_rocm.config", *argv])


def model_args(job_config: Any, use_grouped_mm: bool | None = None) -> Any:
    """A copy of the flavor's model args updated from ``job_config`` as train.py does.

    TorchTitan turns ``use_grouped_mm`` off below CUDA capability 9.0 (every CPU);
    ``use_grouped_mm=True`` puts it back as on an MI300X (capability 9.4).
    """
    from torchtitan.protocols.train_spec import get_train_spec

    spec = get_train_spec(job_config.model.name)
    args = copy.deepcopy(spec.model_args[job_config.model.flavor])
    args.update_from_config(job_config)
    if use_grouped_mm is not None and hasattr(args, "moe_args"):
        args.moe_args.use_grouped_mm = use_grouped_mm
    return args


def build_meta(
    job_config: Any, use_grouped_mm: bool | None = None, args: Any = None
) -> nn.Module:
    """The job's model on the meta device, as train.py builds it (from ``args`` if given)."""
    from torchtitan.protocols.train_spec import get_train_spec

    spec = get_train_spec(job_config.model.name)
    with torch.device("meta"):
        return spec.model_cls(args if args is not None else model_args(job_config, use_grouped_mm))


def two_block_deepseek_args(job_config: Any) -> Any:
    """deepseek_v3 debug model args cut to one dense and one MoE block, grouped-MM path on."""
    args = model_args(job_config, use_grouped_mm=True)
    args.n_layers, args.n_dense_layers, args.n_heads, args.vocab_size = 2, 1, 2, 512
    return args


def materialize(model: nn.Module, seed: int, device: str) -> None:
    """Allocate a meta model on ``device`` and initialise it as TorchTitan does, seeded."""
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device(device))


def random_batch(vocab_size: int, batch: int, seq_len: int, device: str) -> tuple[Any, Any]:
    """Tokens and labels, the same on every call (seed 1)."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab_size, (batch, seq_len), generator=gen).to(device)
    labels = torch.randint(0, vocab_size, (batch, seq_len), generator=gen).to(device)
    return tokens, labels


def loss_and_grads(model: nn.Module, tokens: Any, labels: Any) -> tuple[Any, dict[str, Any]]:
    """One forward and backward: the loss, and each gradient by its unwrapped name."""
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    loss.backward()
    grads = {
        name.replace("._orig_mod", "").replace("._checkpoint_wrapped_module", ""): p.grad
        for name, p in model.named_parameters()
    }
    return loss.detach(), grads


def world_of_one() -> Any:
    """The parallel layout of a single process: nothing sharded, no mesh needed."""
    from torchtitan.distributed import ParallelDims

    return ParallelDims(
        dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1
    )


def convert(job_config: Any, model: nn.Module, parallel_dims: Any = None) -> Any:
    """Build the job's converters and convert ``model`` (train.py order)."""
    from torchtitan.protocols.model_converter import build_model_converters

    converters = build_model_converters(job_config, parallel_dims or world_of_one())
    converters.convert(model)
    return converters


def decisions(converters: Any) -> dict[str, Any]:
    """``{workaround: Decision}`` over every titan-rocm converter in the container."""
    return {d.workaround: d for c in converters.converters for d in getattr(c, "decisions", [])}


@contextlib.contextmanager
def clean_patches() -> Iterator[None]:
    """Undo process-wide patches (apply_compile, grouped-MM binding, counters) afterwards."""
    from torchtitan.protocols.train_spec import get_train_spec

    saved_capture = torch._dynamo.config.capture_scalar_outputs
    try:
        yield
    finally:
        for name in MODELS:
            seams_tt022.restore_apply_compile(get_train_spec(name).parallelize_fn)
        grouped_mm_tt022.unbind_all()
        grouped_mm.reset_calls()
        moe_blocks.EAGER_FORWARD_CALLS.clear()
        torch._dynamo.config.capture_scalar_outputs = saved_capture


def cpu_permute_indices(monkeypatch: Any, moe_module: types.ModuleType) -> None:
    """Let TorchTitan's MoE padding wrapper run on CPU: the package's CPU trainer's patch
    (titan_rocm/adapters/tt022/cpu_trainer.py), undone after the test."""
    from titan_rocm.adapters.tt022 import cpu_trainer

    cpu_trainer.cpu_permute_indices(monkeypatch.setattr, moe_module)


def cpu_histc(monkeypatch: Any) -> None:
    """Let TorchTitan's MoE router count int64 expert indices on CPU: the package's CPU
    trainer's patch, undone after the test."""
    from titan_rocm.adapters.tt022 import cpu_trainer

    cpu_trainer.cpu_histc(monkeypatch.setattr)
