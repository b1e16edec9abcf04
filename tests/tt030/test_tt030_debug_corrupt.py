"""The test fault (``titan_rocm.testing.corrupt``) on TorchTitan 0.3.0's ``RocmTrainer``:
installed on the built trainer, it reaches the blocks 0.3.0 compiles in place (inside the
activation checkpointing wrapper), hits block 1's backward once a step, and leaves the
forward alone."""

from __future__ import annotations

import logging
import math

import pytest

from titan_rocm.testing import corrupt
from titan_rocm.testing.corrupt import ENV


@pytest.fixture(autouse=True)
def _clean_state():
    corrupt.uninstall()
    yield
    corrupt.uninstall()


def _config(cpu_harness):
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from titan_rocm.adapters.tt030 import rocm

    return rocm(cpu_harness.config(llama3_debugmodel(), layers=3, steps=2, compile=True))


@pytest.mark.slow
def test_rocm_trainer_corrupts_block_1s_compiled_backward_each_step(
    cpu_harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    import torch

    from titan_rocm.numerics import blocks

    torch._dynamo.reset()
    with torch._inductor.config.patch(compile_threads=1):
        monkeypatch.delenv(ENV, raising=False)
        clean = cpu_harness.train(_config(cpu_harness))
        torch._dynamo.reset()
        trainer = cpu_harness.build(_config(cpu_harness))
        with caplog.at_level(logging.INFO, "titan_rocm"):
            corrupt.install(trainer.model_parts, corrupt.parse("block=1,fraction=0.1"))
            run = cpu_harness.train(trainer)
    torch._dynamo.reset()
    layers = dict(run.trainer.model_parts[0].layers.named_children())
    assert all(type(b).__name__.endswith("Block") and blocks.key_of(b) == k
               for k, b in layers.items())
    assert layers["1"]._compiled_call_impl is not None  # compiled in place, marked outside
    assert run.losses[0] == clean.losses[0]  # step 1: a backward fault leaves the loss alone
    assert run.losses[1] != clean.losses[1] and all(math.isfinite(x) for x in run.losses)
    hits = corrupt.summary()["hits"]
    assert hits["hits"] == 2  # once a step, in block 1
    assert abs(hits["changed"] / hits["elements"] - 0.1) < 0.02
    assert caplog.text.count("TEST FAULT ACTIVE") == 1
    assert caplog.text.count(f"{ENV} after the first forward and backward: corrupted block 1's "
                             "compiled backward 1 time(s)") == 1
