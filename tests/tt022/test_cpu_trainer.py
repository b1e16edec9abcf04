"""``titan-rocm audit --trainer cpu`` / ``cpu-tiny`` (titan_rocm/adapters/tt022/cpu_trainer.py):
the first builds the config's own model on the CPU, the second its architecture cut small."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torchtitan")

ARGS = ["--job.config_file", "configs/llama3_debug.toml", "--job.custom_config_module",
        "titan_rocm.config", "--training.local_batch_size", "2", "--training.seq_len", "16",
        "--checkpoint.no-enable", "--activation_checkpoint.mode", "none"]


def _build(cls: type, monkeypatch: pytest.MonkeyPatch) -> Any:
    from torchtitan.config import ConfigManager

    from titan_rocm.adapters.tt022 import cpu_trainer

    cpu_trainer.cpu_patches(monkeypatch.setattr)
    monkeypatch.setattr(cls, "patch_for_cpu", False)
    return cls(ConfigManager().parse_args(ARGS))


def test_cpu_keeps_the_configs_model_and_cpu_tiny_cuts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torchtitan.protocols.train_spec import get_train_spec

    from titan_rocm.adapters.tt022.cpu_trainer import TINY, CpuTrainer, TinyCpuTrainer

    stock = get_train_spec("llama3").model_args["debugmodel"]
    own = _build(CpuTrainer, monkeypatch)
    own.close()  # the job's teardown: its workarounds' patches put back
    assert (own.model_args.dim, own.model_args.n_layers, own.model_args.vocab_size) == (
        stock.dim, stock.n_layers, stock.vocab_size)
    assert len(own.model_parts[0].layers) == stock.n_layers
    input_dict, labels = next(iter(own.dataloader))
    assert input_dict["input"].shape == (2, 16) and int(labels.max()) < stock.vocab_size
    tiny = _build(TinyCpuTrainer, monkeypatch)
    tiny.close()
    assert (tiny.model_args.dim, len(tiny.model_parts[0].layers)) == (TINY["dim"],
                                                                      TINY["n_layers"])
    assert stock.dim != TINY["dim"]  # the two are told apart
