"""TorchTitan 0.3.0's real ``Trainer`` on CPU: the stand-ins, and a stock config cut to CPU size.

Unlike 0.2.2 (tests/support/cpu_trainer.py rebuilds ``__init__``), 0.3.0's real ``Trainer.__init__``
runs unchanged: it builds the model from its config tree, calls the model's own
``parallelize_fn`` (activation checkpointing, ``apply_compile`` in place), the loss (compiled
in ``__init__`` when ``"loss"`` is a compile component), optimizers, checkpointer, and then
TorchTitan's ``train()``, ``train_step()``, ``forward_backward_step()`` and ``close()`` run as
they are. What stands in, and why:

- the device type: :func:`force_cpu_device_type` before TorchTitan is imported (its probe
  falls back to "cuda" on a CPU machine);
- ``metrics.build_device_memory_monitor``: the CUDA memory monitor (``cpu_support``);
- ``dist_utils.set_pg_timeouts``: a no-op (it needs ``torch.distributed.set_timeout``, torch
  >= 2.14, and a device barrier), reached after step 1;
- the data: :class:`SyntheticDataLoader`, random tokens with one document per sample
  (``positions`` = 0..L-1), so per-document masks equal plain causal masks; or, with
  ``document_starts``, several documents per sample (``positions`` reset to 0 at each start:
  :func:`document_positions`);
- attention: :class:`CausalSdpa`, whose config subclasses ``FlexAttention.Config`` so the
  trainer still builds its (block-causal) masks and passes them, and whose ``forward`` takes
  FlexAttention's argument names (``q_BLNH``, ``k_BLNH``, ``v_BLNH``; TorchTitan's sharding is
  keyed on them), but runs causal SDPA: FlexAttention has no CPU backward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tests.support.cpu_support import CpuMemoryMonitor, default_rank_env

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "titan_rocm" / "assets" / "tokenizer"
"""A small HF tokenizer the package ships (the trainer builds one; the synthetic loader
does not use it)."""


def force_cpu_device_type() -> None:
    """Make TorchTitan 0.3.0 choose "cpu" (call before it is imported).

    Raises:
        RuntimeError: TorchTitan was imported already, with another device type.
    """
    import sys

    import torch._utils

    utils = sys.modules.get("torchtitan.tools.utils")
    if utils is not None and utils.device_type != "cpu":
        raise RuntimeError(
            f"torchtitan was imported before the CPU harness (device type {utils.device_type!r})"
        )
    torch._utils._get_available_device_type = lambda: "cpu"


def _classes() -> dict[str, type]:
    """The stand-in classes (they subclass TorchTitan's, so they are made on first use)."""
    if _CLASSES:
        return _CLASSES
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.models.common.attention import FlexAttention
    from torchtitan.protocols.module import Module

    class CausalSdpa(Module):
        """Causal SDPA with FlexAttention's interface (see the module docstring)."""

        @dataclass(kw_only=True, slots=True)
        class Config(FlexAttention.Config):
            pass

        def __init__(self, config: Any) -> None:
            super().__init__()

        def forward(self, q_BLNH: torch.Tensor, k_BLNH: torch.Tensor, v_BLNH: torch.Tensor,
                    *, attention_masks: Any = None, scale: float | None = None,
                    enable_gqa: bool = False, **kwargs: Any) -> torch.Tensor:
            out = F.scaled_dot_product_attention(
                q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
                scale=scale, is_causal=True, enable_gqa=enable_gqa,
            )
            return out.transpose(1, 2)

    class SyntheticDataLoader(BaseDataLoader):
        """Deterministic random tokens, one document per sample; checkpointable."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            vocab_size: int = 2048
            seed: int = 0
            document_starts: list[int] = dataclasses.field(default_factory=list)

        def __init__(self, config: Any, *, dp_rank: int = 0, seq_len: int,
                     local_batch_size: int, **kwargs: Any) -> None:
            self.vocab, self.seed = config.vocab_size, config.seed * 1_000 + dp_rank
            self.seq_len, self.batch = seq_len, local_batch_size
            self.starts = list(config.document_starts)
            self.position = 0

        def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
            one = document_positions(self.seq_len, self.starts)
            positions = one.expand(self.batch, -1).contiguous()
            while True:
                g = torch.Generator().manual_seed(self.seed * 100_003 + self.position)
                tokens = torch.randint(0, self.vocab, (self.batch, self.seq_len + 1), generator=g)
                self.position += 1
                yield {"input": tokens[:, :-1], "positions": positions.clone()}, tokens[:, 1:]

        def state_dict(self) -> dict[str, Any]:
            return {"position": self.position}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.position = state_dict.get("position", 0)

    _CLASSES.update(CausalSdpa=CausalSdpa, SyntheticDataLoader=SyntheticDataLoader)
    return _CLASSES


_CLASSES: dict[str, type] = {}


def document_positions(seq_len: int, starts: list[int] | tuple[int, ...] = ()) -> torch.Tensor:
    """``(seq_len,)`` positions of one sample whose documents start at 0 and at each of
    ``starts``: TorchTitan 0.3.0 reads a document start where the position is 0."""
    positions = torch.arange(seq_len)
    for start in sorted(starts):
        positions[start:] = torch.arange(seq_len - start)
    return positions


def build_bf16(config: Any) -> torch.nn.Module:
    """The model of ``config`` on CPU, initialised with a fixed seed, bf16 as FSDP's mixed
    precision computes."""
    with torch.device("meta"):
        model = config.model_spec.model.build()
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_states(buffer_device=torch.device("cpu"))
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
    return model


def convert_mla(config: Any, model: torch.nn.Module, parallel_dims: Any = None,
                **settings: Any) -> Any:
    """titan-rocm's 0.3.0 adapter on ``model`` (``mla_ck_backward`` alone): its decision."""
    from titan_rocm.adapters.tt030.job import RocmJob
    from titan_rocm.settings import RocmSettings

    job = RocmJob(RocmSettings(**settings), names=["mla_ck_backward"])
    job.start(config, parallel_dims)
    return job.apply(model)[0]


def causal_sdpa_config() -> Any:
    """A config for :class:`CausalSdpa` (an ``inner_attention``)."""
    return _classes()["CausalSdpa"].Config()


def cpu_config(config: Any, *, layers: int = 2, steps: int = 3, compile: bool = False,
               seed: int = 0, dump_folder: Path | str = "outputs",
               document_starts: tuple[int, ...] = ()) -> Any:
    """A stock TorchTitan 0.3.0 ``Trainer.Config`` cut to CPU size, in place (returned).

    Keeps the first ``layers`` TransformerBlocks (deepseek_v3's debug model: layer 0 dense,
    then MoE), batch 2 x 128 tokens (documents starting at 0 and ``document_starts`` in each
    sample), ``steps`` steps logged each, no checkpoints, a fixed seed, ``compile`` on the
    model and the loss as the stock config lists them.
    """
    model = config.model_spec.model
    model.layers = model.layers[:layers]
    if hasattr(model, "mtp_layers"):
        model.mtp_layers = []
    for block in model.layers:
        block.attention.inner_attention = causal_sdpa_config()
    config.dataloader = _classes()["SyntheticDataLoader"].Config(
        vocab_size=model.vocab_size, seed=seed, document_starts=list(document_starts)
    )
    config.hf_assets_path = str(TOKENIZER)
    config.training.local_batch_size = 2
    config.training.seq_len = 128
    config.training.steps = steps
    config.lr_scheduler.warmup_steps = 1
    config.compile.enable = compile
    config.checkpoint.enable = False
    config.metrics.log_freq = 1
    config.metrics.disable_color_printing = True
    config.debug.seed = seed
    config.dump_folder = str(dump_folder)
    return config


@dataclass
class Run:
    """What one training run logged, step by step (TorchTitan's ``MetricsProcessor.log``)."""

    trainer: Any
    steps: list[int] = dataclasses.field(default_factory=list)
    losses: list[float] = dataclasses.field(default_factory=list)
    grad_norms: list[float] = dataclasses.field(default_factory=list)


class Harness:
    """The stand-ins installed through ``monkeypatch``, and runs of the real trainer."""

    def __init__(self, monkeypatch: Any, tmp_path: Path) -> None:
        self.monkeypatch = monkeypatch
        self.tmp_path = tmp_path
        self._logged: list[tuple[int, float, float]] = []
        self.stopped: Any = None
        """The ``Stopped`` (``SystemExit``) the latest run ended with, if a stop ended it."""

    @classmethod
    def install(cls, monkeypatch: Any, tmp_path: Path) -> Harness:
        """Patch TorchTitan's CUDA-only helpers (undone by ``monkeypatch``)."""
        import torchtitan.components.metrics as metrics
        import torchtitan.distributed.utils as dist_utils
        from torchtitan.tools import utils

        if utils.device_type != "cpu":
            raise RuntimeError(f"TorchTitan chose device type {utils.device_type!r}, not cpu")
        default_rank_env()
        harness = cls(monkeypatch, tmp_path)
        monkeypatch.setattr(metrics, "build_device_memory_monitor", CpuMemoryMonitor)
        monkeypatch.setattr(dist_utils, "set_pg_timeouts", lambda *args, **kwargs: None)
        original_log = metrics.MetricsProcessor.log

        def log(self: Any, step: int, global_avg_loss: float, global_max_loss: float,
                grad_norm: float, *args: Any, **kwargs: Any) -> Any:
            harness._logged.append((step, float(global_avg_loss), float(grad_norm)))
            return original_log(self, step, global_avg_loss, global_max_loss, grad_norm,
                                *args, **kwargs)

        monkeypatch.setattr(metrics.MetricsProcessor, "log", log)
        return harness

    def config(self, config: Any, **kwargs: Any) -> Any:
        """:func:`cpu_config` with this test's dump folder."""
        kwargs.setdefault("dump_folder", self.tmp_path / "outputs")
        return cpu_config(config, **kwargs)

    def build(self, config: Any) -> Any:
        """``config.build()``: the trainer class the config belongs to, constructed."""
        return config.build()

    def train(self, config_or_trainer: Any) -> Run:
        """Build (unless given a trainer), ``train()`` and ``close()`` as ``torchtitan.train``
        does (``close()`` also when training raised an ``Exception``); return what was logged.

        A stop (the guard's, the audit's) ends the rank as the process would end: the trainer
        closed, the process group destroyed, ``SystemExit`` with exit code 17 (checked here);
        the error that caused it is raised for the test to read."""
        from titan_rocm.adapters.stop import Stopped

        trainer = config_or_trainer
        if not hasattr(trainer, "train_step"):
            trainer = self.build(config_or_trainer)
        self._logged.clear()
        run = Run(trainer)
        stopped: Stopped | None = None
        try:
            try:
                trainer.train()
            except Exception:
                trainer.close()
                raise
            finally:
                for step, loss, grad_norm in self._logged:
                    run.steps.append(step)
                    run.losses.append(loss)
                    run.grad_norms.append(grad_norm)
            trainer.close()
        except Stopped as stop:
            stopped = stop
        if stopped is not None:
            assert stopped.code == 17 and not torch.distributed.is_initialized()
            self.stopped = stopped
            raise stopped.error  # outside the except: its own __context__ stays as it was
        return run
