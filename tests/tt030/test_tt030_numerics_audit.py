"""The block-by-block audit on TorchTitan 0.3.0 (docs/numerics-audit.md): the real 0.3.0
trainer on CPU (tests/tt030/tt030_harness.py), compiled with titan-rocm, audited through the
adapter (:func:`titan_rocm.adapters.tt030.audit.audit_built`), ``titan-rocm audit --module M
--config F`` (in process) and ``rocm.numerics_audit`` inside ``Trainer.train()`` (the
adapter's seam)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from titan_rocm.testing import audit_matrix, corrupt
from titan_rocm.testing.corrupt import ENV

TT030 = Path(__file__).parent


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.delenv(ENV, raising=False)
    corrupt.uninstall()
    torch._dynamo.reset()
    with torch._inductor.config.patch(compile_threads=1):
        yield
    corrupt.uninstall()
    torch._dynamo.reset()


def _make(model: str) -> Any:
    if model == "llama3":
        from torchtitan.models.llama3.config_registry import llama3_debugmodel as make
    elif model == "qwen3":
        from torchtitan.models.qwen3.config_registry import qwen3_debugmodel as make
    else:
        from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel as make
    return make()


def _config(cpu_harness: Any, model: str = "llama3", param: str = "float32",
            layers: int = 2, **settings: Any) -> Any:
    from titan_rocm.adapters.tt030 import rocm

    seed = settings.pop("seed", 0)
    steps = settings.pop("steps", 1)
    config = cpu_harness.config(_make(model), layers=layers, steps=steps, compile=True,
                                seed=seed)
    # One CPU rank is still FSDP-wrapped by 0.3.0: its parameter dtype is the job's dtype.
    config.training.mixed_precision_param = param
    return rocm(config, **settings)


def _audit(trainer: Any, batch: Any = None, chunks: int | None = None) -> dict[str, Any]:
    from titan_rocm.adapters.tt030.audit import audit_built

    input_dict, labels = batch or next(iter(trainer.dataloader))
    seen = trainer.ntokens_seen
    grads = [p.grad for p in trainer.model_parts[0].parameters()]
    result = audit_built(trainer, trainer.config.rocm, input_dict, labels, chunks=chunks)
    assert trainer.ntokens_seen == seen  # the kit puts 0.3.0's token count back
    assert all(p.grad is g for p, g in zip(trainer.model_parts[0].parameters(), grads,
                                           strict=True))
    return result.to_dict()


def _matrix(cpu_harness: Any, model: str, param: str, seeds: int,
            fractions: tuple[float, ...] = audit_matrix.FRACTIONS) -> list[Any]:
    import torch

    trainer = cpu_harness.build(_config(cpu_harness, model, param, layers=3))
    state: dict[str, Any] = {}
    loader = iter(trainer.dataloader)

    def reseed(seed: int) -> None:
        torch.manual_seed(seed)
        with torch.no_grad():
            trainer.model_parts[0].init_states(buffer_device=None)
        state["batch"] = next(loader)

    try:
        audit_matrix.install(trainer.model_parts)
        keys = [k for k, _ in trainer.model_parts[0].layers.named_children()]
        specs = audit_matrix.fault_specs(audit_matrix.first_middle_last(keys), fractions)
        return audit_matrix.run(lambda: _audit(trainer, state["batch"]), specs,
                                list(range(seeds)), reseed)
    finally:
        trainer.close()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama3", "qwen3", "deepseek_v3"])
def test_the_detection_matrix_on_the_0_3_0_trainer(cpu_harness: Any, model: str) -> None:
    """Three blocks, float32 parameters, compiled once: five clean seeds ok; 0.5 % (the
    smallest fraction 0.2.2's matrix proves, with 1 % and 3 %) of the first forward ``mul`` the
    block's output depends on, and of the first backward ``mul``, in the first, middle and
    last block, each flagged and named first wrong in its direction (a backward fault leaving
    the forward clean)."""
    outcomes = _matrix(cpu_harness, model, "float32", seeds=5, fractions=(0.005,))
    assert len(outcomes) == 5 + 6
    assert [o.to_dict() for o in outcomes if not o.judged["right"]] == []
    clean = [o.result for o in outcomes if o.spec is None]
    assert all((r["job_dtype"], r["reference"]) == ("float32", "float32") for r in clean)


@pytest.mark.slow
def test_bf16_fsdp_faults_are_named_at_their_block(cpu_harness: Any) -> None:
    """0.3.0's default bfloat16 FSDP parameters: everything computes in bfloat16, the
    residual stream too. Clean seeds ok against bfloat16's eager error (not 0). Every fault
    flagged at its block; a backward fault in the backward, a forward fault in the forward
    when it moves the block's output beyond bfloat16's rounding of the residual stream, in
    the backward (whose saved activations it corrupted) when it does not: at random
    initialisation a block adds little to the residual, so its forward errors sit under that
    rounding (docs/numerics-audit.md, "What it cannot see")."""
    outcomes = _matrix(cpu_harness, "llama3", "bfloat16", seeds=3, fractions=(0.005, 0.03))
    clean = [o.result for o in outcomes if o.spec is None]
    assert all(r["verdict"] == "ok" for r in clean)
    assert all((r["job_dtype"], r["reference"]) == ("bfloat16", "float32") for r in clean)
    eager = sorted(t["err_eager"] for r in clean for t in r["tensors"]
                   if t["kind"] == "param_grad")
    assert 1e-3 < eager[len(eager) // 2] < 2e-2, eager  # bfloat16's error, not 0
    for o in outcomes:
        if o.spec is None:
            continue
        first = o.result["first_wrong"]
        key = str(o.spec["block"])
        assert o.verdict == "flagged", o.to_dict()
        if o.spec["graph"] == "backward":
            assert first == {"forward": None, "backward": key}, o.to_dict()
        else:
            assert key in (first["forward"], first["backward"]), o.to_dict()
            assert first["forward"] in (None, key), o.to_dict()


@pytest.mark.slow
def test_0_3_0_replays_in_runs_of_rows_are_the_whole_batchs(cpu_harness: Any) -> None:
    """0.3.0's step (``post_dataloading_process`` + ``_forward_backward_body``, the loss over
    the step's token count) with each replay in 2 runs of one row: the whole 2-row
    micro-batch's errors, the token count put back."""
    trainer = cpu_harness.build(_config(cpu_harness, seed=2))
    try:
        batch = next(iter(trainer.dataloader))
        assert batch[1].shape[0] == 2
        whole = _audit(trainer, batch)
        split = _audit(trainer, batch, chunks=2)
    finally:
        trainer.close()
    assert split["verdict"] == "ok" and split["chunks"] == 2
    for a, b in zip(split["tensors"], whole["tensors"], strict=True):
        # A float32 reference (FSDP): both errors are float32 rounding, which the order of
        # accumulation moves; a row missing or counted twice would be an error of order 1.
        assert a["name"] == b["name"] and a["flagged"] == b["flagged"]
        assert a["err_job"] < 1e-5 and b["err_job"] < 1e-5, a["name"]


@pytest.mark.slow
def test_deepseek_v3_experts_are_judged_at_bfloat16s_error_and_a_gemm_fault_is_named(
        cpu_harness: Any) -> None:
    """0.3.0's ``GroupedExperts`` computes in bfloat16 whatever the parameters' dtype; the
    float32 reference holds those casts, so the experts are judged against a float32 answer
    (their eager error is bfloat16's, ~5e-3, not 0). 3 % of the first grouped GEMM of block
    1's compiled backward: the experts flagged, block 1 first wrong in the backward."""
    trainer = cpu_harness.build(_config(cpu_harness, "deepseek_v3"))
    try:
        corrupt.install(trainer.model_parts, corrupt.CorruptSpec(
            block=1, op="_grouped_mm", fraction=0.03))
        corrupt.switch(None)
        batch = next(iter(trainer.dataloader))
        clean = _audit(trainer, batch)
        corrupt.switch(corrupt.CorruptSpec(block=1, op="_grouped_mm", fraction=0.03))
        bad = _audit(trainer, batch)
    finally:
        trainer.close()
    assert clean["verdict"] == "ok", [t for t in clean["tensors"] if t["flagged"]]
    experts = [t for t in clean["tensors"] if ".inner_experts." in t["name"]]
    assert experts and all(1e-3 < t["err_eager"] < 2e-2 and t["ratio"] < 2
                           for t in experts), experts
    assert any("down-casts held at float32 (" in n for n in clean["notes"]), clean["notes"]
    assert bad["first_wrong"] == {"forward": None, "backward": "1"}
    assert any(t["flagged"] for t in bad["tensors"] if ".inner_experts." in t["name"])


# -- titan-rocm audit --module M --config F, in process -------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from titan_rocm.cli import main

    code = main(["audit", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_cli_audits_a_0_3_0_job_with_its_workarounds_attributed(
        cpu_harness: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The job's own decisions reach the result on 0.3.0 (``RocmJob``'s JobWorkarounds):
    ``precision_casts`` (on) applied and named on the compiled blocks."""
    monkeypatch.syspath_prepend(str(TT030))
    monkeypatch.chdir(cpu_harness.tmp_path)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    code, out, err = _cli(capsys, "--module", "tt030_audit_job", "--config", "llama3_cpu",
                          "--json", "--tokens", "200", "--rocm.precision_casts", "on")
    assert code == 0, err[-2000:]
    result = json.loads(out)
    assert result["verdict"] == "ok" and result["exit_code"] == 0
    assert result["tokens"] == 128  # whole rows of 128 while they fit
    assert result["reference"] == "float32"  # one rank is FSDP-wrapped
    assert "precision_casts" in result["workarounds_applied"]
    blocks = [s for s in result["segments"] if s["kind"] == "block"]
    assert blocks and all(s["scope"] == "compiled" and "precision_casts" in s["workarounds"]
                          for s in blocks)
    assert not list(cpu_harness.tmp_path.rglob("checkpoint"))  # nothing of the job written


@pytest.mark.parametrize("args,sentence", [
    (["--module", "llama3", "--config", "llama3_debugmodel", "--tokens", "0"],
     "--tokens: '0' is not valid; accepted: an integer >= 1 and <= 1000000000000"),
    (["--job.config_file", "job.toml"], "--job.config_file is TorchTitan 0.2.2's"),
    (["--module", "llama3", "--config", "llama3_debugmodel", "--reference-chunks", "x"],
     "--reference-chunks: 'x' is not valid; accepted: an integer >= 1 and <= 1000000000"),
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
    """llama3 compiled, 3 steps, with the audit begun at step 1 (each step's own forward and
    backward, before its optimizer step; spread over steps 1 to 3) and without: every logged
    loss and grad norm, the token count and every final parameter the same; the result
    attributes the applied workarounds."""
    import torch

    plain = cpu_harness.train(_config(cpu_harness, steps=3, numerics_audit="off"))
    torch._dynamo.reset()
    audited = cpu_harness.train(_config(cpu_harness, steps=3, numerics_audit="first_step",
                                        precision_casts="on"))
    assert plain.steps == audited.steps == [1, 2, 3]
    assert audited.losses == plain.losses and audited.grad_norms == plain.grad_norms
    assert audited.trainer.ntokens_seen == plain.trainer.ntokens_seen
    for a, b in zip(audited.trainer.model_parts[0].parameters(),
                    plain.trainer.model_parts[0].parameters(), strict=True):
        assert torch.equal(a, b)
    audit = audited.trainer._rocm.workarounds.instances["numerics_audit"]
    # Spread over steps (the default): block 0, block 1, then the rest.
    assert [(r["step"], r["part"]["blocks"], r["part"]["outside"]) for r in audit.results] == [
        (1, ["0"], False), (2, ["1"], False), (3, [], True)]
    assert all(r["verdict"] == "ok" for r in audit.results)
    assert "precision_casts" in audit.results[0]["workarounds_applied"]
    decisions = {d.workaround: d for d in audited.trainer._rocm.decisions}
    assert decisions["numerics_audit"].applied
