"""``numerics_audit_policy = "quarantine"`` on TorchTitan 0.3.0's real trainer on CPU
(tests/tt030/tt030_harness.py: one FSDP-wrapped rank, blocks compiled in place with
``module.compile()``, the loss compiled): a compiled-code fault is quarantined at the step
that flags it, the redone micro-batch counts its tokens once, the block stays eager while the
others stay compiled, its recheck is ok, and every step's loss is within the noise band of
clean runs (docs/numerics-audit.md#quarantine)."""

from __future__ import annotations

from typing import Any

import pytest

from titan_rocm.testing import corrupt
from titan_rocm.testing.corrupt import ENV

TOLERANCE = 1e-6
"""As tests/unit/numerics/test_quarantine.py: CPU float32 repeats are bit-identical, so the
noise band is the tolerance, above eager-versus-compiled rounding, below the fault."""


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch: pytest.MonkeyPatch):
    import torch

    from titan_rocm import patches
    from titan_rocm.workarounds.numerics_audit import quarantine

    monkeypatch.delenv(ENV, raising=False)
    corrupt.uninstall()
    torch._dynamo.reset()
    with torch._inductor.config.patch(compile_threads=1):
        yield
    patches.restore(by=quarantine.BY)
    corrupt.uninstall()
    torch._dynamo.reset()


def _run(cpu_harness: Any, policy: str, fault: str | None = None) -> tuple[Any, Any, dict]:
    """llama3 (three blocks), 5 steps, whole audits at steps 1 and 4, under ``policy``."""
    import torch
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from titan_rocm.adapters.tt030 import rocm

    torch._dynamo.reset()
    config = cpu_harness.config(llama3_debugmodel(), layers=3, steps=5, compile=True)
    config.training.mixed_precision_param = "float32"
    config = rocm(config, numerics_audit="every_n_steps", numerics_audit_every=4,
                  numerics_audit_spread=1, numerics_audit_policy=policy)
    trainer = cpu_harness.build(config)
    if fault is not None:
        corrupt.install(trainer.model_parts, corrupt.parse(fault))
    seen: dict[str, Any] = {}
    train = trainer.train

    def train_and_look() -> Any:
        out = train()
        seen["compiled"] = {k: b._compiled_call_impl is not None
                            for k, b in trainer.model_parts[0].layers.named_children()}
        seen["tokens"] = trainer.ntokens_seen
        return out

    trainer.train = train_and_look
    run = cpu_harness.train(trainer)
    return run, trainer._rocm.workarounds.instances["numerics_audit"], seen


@pytest.mark.torchtitan030
def test_0_3_0_backward_fault_is_quarantined_and_trains_to_a_clean_runs_loss(
        cpu_harness: Any) -> None:
    """3 % of block 2's (the last) compiled backward: flagged at step 1, redone with block 2
    eager (its ``_compiled_call_impl`` taken away while FSDP's hooks stay on the module), the
    recheck at step 2 and the audit at step 4 ok; the token count is a clean run's, and every
    step's loss within the clean runs' noise band."""
    from titan_rocm.logs.compare import noise_band, relative

    clean, _, clean_seen = _run(cpu_harness, "quarantine")
    repeat, _, _ = _run(cpu_harness, "quarantine")
    healed, audit, seen = _run(cpu_harness, "quarantine",
                               "block=2,graph=backward,fraction=0.03")
    assert healed.steps == clean.steps == [1, 2, 3, 4, 5]
    assert [(r["step"], r["verdict"]) for r in audit.results] == [
        (1, "flagged"), (2, "ok"), (4, "ok")]
    assert audit.results[0]["first_wrong"] == {"forward": None, "backward": "2"}
    assert audit.quarantined == {"2": 1}
    assert seen["compiled"] == {"0": True, "1": True, "2": False}
    assert seen["tokens"] == clean_seen["tokens"]
    base = dict(zip(clean.steps, clean.losses, strict=True))
    band = noise_band(base, [dict(zip(repeat.steps, repeat.losses, strict=True))], TOLERANCE)
    diff = relative(base, dict(zip(healed.steps, healed.losses, strict=True)))
    assert max(abs(v) for v in diff.values) <= band.values[-1], (diff.values, band.values)
