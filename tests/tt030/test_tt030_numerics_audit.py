"""The numerics audit on TorchTitan 0.3.0 (docs/numerics-audit.md): the real 0.3.0 trainer on
CPU (tests/tt030/tt030_harness.py), compiled with titan-rocm, audited through the API
(:func:`titan_rocm.torchtitan.audit.audit_030`), ``titan-rocm audit --module M --config F``
(in process) and ``rocm.numerics_audit`` inside ``Trainer.train()`` (the adapter's seam)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from titan_rocm.numerics import corrupt
from titan_rocm.numerics.corrupt import ENV

TT030 = Path(__file__).parent


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.delenv(ENV, raising=False)
    corrupt.uninstall()
    torch._dynamo.reset()
    with torch._inductor.config.patch(compile_threads=1):
        yield
    from titan_rocm.workarounds import numerics_audit

    numerics_audit.uninstall()
    corrupt.uninstall()
    torch._dynamo.reset()


def _config(cpu_harness: Any, model: str = "llama3", **settings: Any) -> Any:
    from titan_rocm.adapters.tt030 import rocm

    if model == "llama3":
        from torchtitan.models.llama3.config_registry import llama3_debugmodel as make
    else:
        from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel as make
    seed = settings.pop("seed", 0)
    steps = settings.pop("steps", 1)
    config = cpu_harness.config(make(), layers=2, steps=steps, compile=True, seed=seed)
    # One CPU rank is still FSDP-wrapped by 0.3.0; its bf16 all-gather cannot be raised for
    # the reference (the audit refuses it, naming this flag).
    config.training.mixed_precision_param = "float32"
    return rocm(config, **settings)


def _audit(cpu_harness: Any, model: str = "llama3", seed: int = 0) -> Any:
    from titan_rocm.adapters.tt030.audit import audit_030
    from titan_rocm.numerics.stats import AuditSettings

    trainer = cpu_harness.build(_config(cpu_harness, model, seed=seed))
    try:
        input_dict, labels = next(iter(trainer.dataloader))
        seen = trainer.ntokens_seen
        result = audit_030(trainer, input_dict, labels, AuditSettings.of(trainer.config.rocm))
        assert trainer.ntokens_seen == seen  # the passes put 0.3.0's token count back
        assert all(p.grad is None for p in trainer.model_parts[0].parameters())
    finally:
        trainer.close()
    return result


def _flagged_blocks(result: Any) -> set[str]:
    return {b["block"] for b in result.blocks() if b["flagged"]}


@pytest.mark.slow
def test_clean_compiled_0_3_0_trainer_is_ok(cpu_harness: Any) -> None:
    for seed in (0, 1):
        r = _audit(cpu_harness, "llama3", seed)
        assert not r.flagged, (seed, [p.reason for p in r.parameters if p.flagged], r.loss)
        assert r.reference_dtype == "float32" and r.job_dtype == "float32"  # FSDP: float32
        assert r.attribution.compiled("layers.0.attention.wq.weight")
        assert math.isfinite(r.loss["job"]) and r.loss["job"] > 0


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "unexplained: deepseek_v3 debug on 0.3.0 (one-rank FSDP, so a float32 reference: the "
    "eager pass is the reference, err_eager = 0) flags block 1's MoE gradients, the job's "
    "3.5e-3 rms off eager (experts, router, ffn_norm) with the loss identical; strict: this "
    "fails once it is ok, to become a plain clean test"))
def test_clean_compiled_0_3_0_deepseek_v3_is_ok(cpu_harness: Any) -> None:
    r = _audit(cpu_harness, "deepseek_v3", 0)
    assert not r.flagged, [p.reason for p in r.parameters if p.flagged]


@pytest.mark.slow
def test_corrupted_block_backward_is_flagged_and_named(cpu_harness: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The injector corrupts 3 % of block 0's compiled backward node (compiled code only):
    block 0's parameters flagged, block 1's not, block 0 the origin, the loss untouched."""
    monkeypatch.setenv(ENV, "block=0,fraction=0.03")
    r = _audit(cpu_harness)
    flagged = {p.name for p in r.parameters if p.flagged}
    assert any(n.startswith("layers.0.") for n in flagged), flagged
    assert not any(n.startswith("layers.1.") for n in flagged), flagged
    assert "0" in _flagged_blocks(r) <= {"0", "(outside blocks)"}
    assert r.origin() == "0"
    assert not r.loss["flagged"]
    assert corrupt.summary()["hits"]["hits"] == 1  # the job pass only: eager runs no compiled code


# -- titan-rocm audit --module M --config F, in process -------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from titan_rocm.cli import main

    code = main(["audit", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_cli_audits_a_0_3_0_job_and_exits_0(cpu_harness: Any, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(TT030))
    monkeypatch.chdir(cpu_harness.tmp_path)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    code, out, err = _cli(capsys, "--module", "tt030_audit_job", "--config", "llama3_cpu",
                          "--json", "--tokens", "200")
    assert code == 0, err[-2000:]
    result = json.loads(out)
    assert result["verdict"] == "ok" and result["exit_code"] == 0
    assert result["tokens"] == 128  # whole rows of 128 while they fit
    assert result["reference_dtype"] == "float32"  # one rank is FSDP-wrapped
    assert any(p["compiled"] for p in result["parameters"])
    assert not list(cpu_harness.tmp_path.rglob("checkpoint"))  # nothing of the job written


@pytest.mark.parametrize("args,sentence", [
    (["--module", "llama3", "--config", "llama3_debugmodel", "--tokens", "0"],
     "--tokens 0 is not valid; accepted: a whole number >= 1"),
    (["--job.config_file", "job.toml"], "--job.config_file is TorchTitan 0.2.2's"),
    (["--module", "llama3", "--config", "llama3_debugmodel", "--trainer", "a:B"],
     "--trainer 'a:B' is TorchTitan 0.2.2's"),
    (["--module", "llama3", "--config", "no_such_config"], "no_such_config"),
])
def test_cli_bad_input_exits_2_with_one_sentence(capsys: pytest.CaptureFixture[str],
                                                args: list[str], sentence: str) -> None:
    code, out, err = _cli(capsys, "--json", *args)
    assert code == 2, (out[-1000:], err[-2000:])
    result = json.loads(out)
    assert result["verdict"] == "error" and sentence in result["error"], result["error"]
    assert sentence in err and "Traceback" not in err


# -- rocm.numerics_audit inside Trainer.train() ------------------------------------------------


@pytest.mark.slow
def test_in_training_first_step_audit_leaves_the_trajectory_bit_identical(
        cpu_harness: Any) -> None:
    """llama3 compiled, 3 steps, with the audit before step 1's optimizer step and without:
    every logged loss and grad norm, the token count and every final parameter the same."""
    import torch

    from titan_rocm.workarounds import numerics_audit

    plain = cpu_harness.train(_config(cpu_harness, steps=3, numerics_audit="off"))
    numerics_audit.uninstall()
    torch._dynamo.reset()
    audited = cpu_harness.train(_config(cpu_harness, steps=3, numerics_audit="first_step"))
    assert plain.steps == audited.steps == [1, 2, 3]
    assert audited.losses == plain.losses and audited.grad_norms == plain.grad_norms
    assert audited.trainer.ntokens_seen == plain.trainer.ntokens_seen
    for a, b in zip(audited.trainer.model_parts[0].parameters(),
                    plain.trainer.model_parts[0].parameters(), strict=True):
        assert torch.equal(a, b)
    audit = numerics_audit._audits[0]
    assert [r["step"] for r in audit.results] == [1]
    assert audit.results[0]["verdict"] == "ok"
    decisions = {d.workaround: d for d in audited.trainer._rocm.decisions}
    assert decisions["numerics_audit"].applied
