"""``numerics_audit_policy = "quarantine"`` (docs/numerics-audit.md#quarantine) on TorchTitan
0.2.2's real ``Trainer.train()`` on CPU (tests/support/audit_trainer.py: blocks compiled by the
model's own ``parallelize_fn``, each an ``OptimizedModule``), with the test fault in compiled
code only (``TITAN_ROCM_DEBUG_CORRUPT``): the flagged micro-batch is redone with the segment
eager, the segment stays eager, later audits of it are ok, and the final loss lands within the
noise band of clean runs."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch

TESTS = Path(__file__).resolve().parents[2]

STEPS = 6
EVERY = ["--rocm.numerics_audit", "every_n_steps", "--rocm.numerics_audit_every", "4"]
"""Audits at steps 1 and 4 (each whole: ``SPREAD``), and the recheck a quarantine asks for at
the step after it."""
SPREAD = ["--rocm.numerics_audit_spread", "1"]
"""The whole audit at step 1, so a fault there from the first step is caught before any of
its gradients is applied: what is left to compare is quarantine alone."""
TOLERANCE = 1e-6
"""The relative loss difference never called one (``compare --tolerance``, as a fraction).
On CPU in float32 repeat runs are bit-identical, so the noise band is this tolerance: above a
block run eager instead of compiled (float32 rounding, a few 1e-7 after six steps), below
what one step of the test fault's gradients leaves (1e-5 and more)."""


@pytest.fixture
def audit_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    """tests/support/audit_trainer.py importable, the fault off, process patches undone."""
    from tests.support.moe_test_models import clean_patches

    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("TITAN_ROCM_DEBUG_CORRUPT", raising=False)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    from tests.support import cpu_trainer

    cpu_trainer.cpu_patches(monkeypatch.setattr)
    monkeypatch.setattr(cpu_trainer.CpuTrainer, "patch_for_cpu", False)
    from titan_rocm.testing import corrupt

    corrupt.uninstall()
    with clean_patches(), torch._inductor.config.patch(compile_threads=1):
        from tests.support import audit_trainer

        yield audit_trainer
    from titan_rocm import patches
    from titan_rocm.workarounds.divergence_guard import hooks
    from titan_rocm.workarounds.numerics_audit import quarantine, seams_tt022

    seams_tt022.uninstall()
    patches.restore(by=quarantine.BY)
    hooks.uninstall()
    corrupt.uninstall()


class Run:
    """One training run: each step's logged loss, the audit's results and log lines, and
    which blocks ran compiled at the end (before the trainer closed)."""

    def __init__(self, losses: dict[int, float], results: list[dict[str, Any]],
                 lines: list[str], compiled: dict[str, bool], audit: Any) -> None:
        self.losses, self.results, self.lines = losses, results, lines
        self.compiled, self.audit = compiled, audit
        self.loss_compiled: bool | None = None


def _compiled(trainer: Any) -> dict[str, bool]:
    """Block key -> whether calling it runs compiled code now: an ``OptimizedModule`` in it
    whose ``forward`` is Dynamo's, or a module compiled in place (deepseek_v3's MoE blocks
    under ``moe_eager_compile`` have compiled children only)."""
    from torch._dynamo.eval_frame import OptimizedModule

    def runs_compiled(m: torch.nn.Module) -> bool:
        if isinstance(m, OptimizedModule):
            return hasattr(m.__dict__.get("forward"), "_torchdynamo_orig_callable")
        return getattr(m, "_compiled_call_impl", None) is not None

    return {key: any(runs_compiled(m) for m in block.modules())
            for key, block in trainer.model_parts[0].layers.named_children()}


def train(audit_env: Any, monkeypatch: Any, caplog: Any, policy: str,
          fault: str | None = None, model: str = "llama3", layers: int = 3,
          steps: int = STEPS, extra: list[str] | None = None) -> Run:
    """Train ``model`` (``layers`` blocks) ``steps`` steps under ``policy`` with ``fault``
    (compiled code only) from the first step."""
    from torchtitan.components.metrics import MetricsProcessor

    from titan_rocm.adapters.tt022.converters.converter import JOB_ATTR
    from titan_rocm.testing import corrupt

    losses: dict[int, float] = {}
    original = MetricsProcessor.log

    def log(self: Any, step: int, loss: Any, *a: Any, **k: Any) -> Any:
        losses[step] = float(loss)
        return original(self, step, loss, *a, **k)

    monkeypatch.setattr(audit_env.AuditTrainer, "data_batches", None)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="titan_rocm")
    trainer, _ = audit_env.build(audit_env.MODELS[model] + [
        "--training.steps", str(steps), "--metrics.log_freq", "1",
        "--rocm.numerics_audit_policy", policy, *EVERY, *(extra or [])], layers)
    if fault is not None:
        corrupt.install(trainer.model_parts, corrupt.parse(fault))
    audit = trainer.model_parts[0].__dict__[JOB_ATTR].instances["numerics_audit"]
    MetricsProcessor.log = log
    compiled: dict[str, bool] = {}
    loss_compiled = None
    try:
        trainer.train()
        compiled = _compiled(trainer)
        loss_compiled = hasattr(trainer.loss_fn, "_torchdynamo_orig_callable")
    finally:
        MetricsProcessor.log = original
        trainer.close()
    lines = [m for m in caplog.messages if "numerics audit" in m or "quarantine" in m]
    from titan_rocm.workarounds.numerics_audit import seams_tt022

    seams_tt022.uninstall()
    run = Run(losses, audit.results, lines, compiled, audit)
    run.loss_compiled = loss_compiled
    return run


def within_noise(base: dict[int, float], repeats: list[dict[int, float]],
                 other: dict[int, float]) -> tuple[float, float]:
    """``other``'s largest relative loss difference to ``base`` over the steps, and the noise
    band at the last, as ``titan-rocm compare --noise`` computes them (with
    :data:`TOLERANCE`)."""
    from titan_rocm.logs.compare import noise_band, relative

    band = noise_band(base, repeats, TOLERANCE)
    diff = relative(base, other)
    return max(abs(v) for v in diff.values), band.values[-1]


def check_quarantined(run: Run, block: str, step: int, steps: int = STEPS) -> None:
    """``block`` (a ``model.layers`` key, or ``head``) quarantined at ``step`` (one line),
    eager to the end while every other block stays compiled, each later audit of it ok, and
    the run trained every step."""
    from titan_rocm import audit_message

    assert sorted(run.losses) == list(range(1, steps + 1))
    quarantined = [m for m in run.lines if audit_message.QUARANTINED.search(m)]
    assert len(quarantined) == 1, run.lines
    found = audit_message.QUARANTINED.search(quarantined[0])
    name = block if block == "head" else f"block {block}"
    assert found and found["segment"] == name and int(found["step"]) == step
    assert "(first wrong in the" in quarantined[0]
    assert run.compiled == {k: k != block for k in run.compiled}
    later = [r for r in run.results if r["step"] > step
             and any(s["segment"] == block for s in r["segments"])]
    assert later and all(r["verdict"] == "ok" for r in later), [
        (r["step"], r["verdict"]) for r in run.results]
    assert run.audit.quarantined == {block: step}
    assert f"titan-rocm: the quarantined {name} is ok at step {later[0]['step']} " \
           f"(eager since step {step})" in run.lines


_CLEAN: dict[str, tuple[dict[int, float], dict[int, float]]] = {}
"""Per model: a clean run's losses and a repeat's (computed once per process)."""


def clean_runs(audit_env: Any, monkeypatch: Any, caplog: Any,
               model: str = "llama3") -> tuple[dict[int, float], dict[int, float]]:
    """Two clean runs of ``model`` under quarantine (nothing is flagged in either)."""
    if model not in _CLEAN:
        runs = [train(audit_env, monkeypatch, caplog, "quarantine", model=model,
                      extra=SPREAD) for _ in range(2)]
        for run in runs:
            assert not [m for m in run.lines if "quarantined" in m], run.lines
            assert run.results and all(r["verdict"] == "ok" for r in run.results)
        _CLEAN[model] = (runs[0].losses, runs[1].losses)
    return _CLEAN[model]


@pytest.mark.slow
def test_a_forward_fault_is_quarantined_and_trains_to_a_clean_runs_loss(
        audit_env: Any, monkeypatch: Any, caplog: Any) -> None:
    """3 % of block 1's compiled forward (llama3, three blocks) from the first step: the audit
    at step 1 flags it, the micro-batch is redone with block 1 eager, so no gradient of the
    flagged pass is applied; block 1 stays eager while blocks 0 and 2 stay compiled, the
    recheck at step 2 and the audit at step 4 are ok, and every step's loss is within the
    noise band of two clean runs, where the same fault under ``warn`` leaves it."""
    clean, repeat = clean_runs(audit_env, monkeypatch, caplog)
    fault = "block=1,graph=forward,fraction=0.03"
    healed = train(audit_env, monkeypatch, caplog, "quarantine", fault, extra=SPREAD)
    check_quarantined(healed, "1", 1)
    assert [(r["step"], r["verdict"]) for r in healed.results] == [
        (1, "flagged"), (2, "ok"), (4, "ok")]
    diff, band = within_noise(clean, [repeat], healed.losses)
    assert diff <= band, (diff, band, healed.losses, clean)
    warned = train(audit_env, monkeypatch, caplog, "warn", fault, extra=SPREAD)
    diff, band = within_noise(clean, [repeat], warned.losses)
    assert diff > band, (diff, band)


@pytest.mark.slow
@pytest.mark.parametrize("model,fault", [
    ("llama3", "block=0,graph=forward,fraction=0.03"),
    ("llama3", "block=0,graph=backward,fraction=0.03"),
    ("llama3", "block=1,graph=backward,fraction=0.03"),
    ("llama3", "block=2,graph=forward,fraction=0.03"),
    ("llama3", "block=2,graph=backward,fraction=0.03"),
    ("deepseek_v3", "block=1,graph=forward,fraction=0.03"),
    ("deepseek_v3", "block=2,graph=backward,fraction=0.03"),
    ("llama3", "block=head,graph=forward,op=sub,fraction=0.03"),
    ("llama3", "block=head,graph=backward,op=sub,fraction=0.03"),
])
def test_the_quarantine_matrix(audit_env: Any, monkeypatch: Any, caplog: Any, model: str,
                               fault: str) -> None:
    """Forward and backward faults in the first, a middle and the last block (deepseek_v3:
    dense block 0, MoE blocks 1 and 2, whose token counts the redo puts back) and in the
    head's compiled loss: each quarantined at step 1, eager to the end with later audits ok,
    every step's loss within the clean runs' noise band."""
    from titan_rocm.testing import corrupt

    clean, repeat = clean_runs(audit_env, monkeypatch, caplog, model)
    healed = train(audit_env, monkeypatch, caplog, "quarantine", fault, model=model,
                   extra=SPREAD)
    check_quarantined(healed, corrupt.parse(fault).key, 1)
    assert healed.loss_compiled == (corrupt.parse(fault).key != "head")
    diff, band = within_noise(clean, [repeat], healed.losses)
    assert diff <= band, (diff, band, healed.losses, clean)


@pytest.mark.slow
def test_a_spread_audit_quarantines_at_the_step_replaying_the_block_and_rechecks_next(
        audit_env: Any, monkeypatch: Any, caplog: Any) -> None:
    """The default spread (block 0, 1, 2, then the rest at steps 1 to 4): 3 % of block 1's
    backward is flagged at step 2 and quarantined there; the recheck of block 1 runs at step 3,
    ahead of the parts still to run, and is ok; the audit's end line counts five parts. Step 1
    applied the fault's gradients (the detection latency quarantine cannot undo), so the loss
    is judged against compare's default tolerance (0.01 %) only."""
    from titan_rocm.logs.compare import DEFAULT_TOLERANCE_PCT, noise_band, relative

    clean, repeat = clean_runs(audit_env, monkeypatch, caplog)
    healed = train(audit_env, monkeypatch, caplog, "quarantine",
                   "block=1,graph=backward,fraction=0.03")
    check_quarantined(healed, "1", 2)
    assert [(r["step"], r["part"]["blocks"], r["verdict"]) for r in healed.results] == [
        (1, ["0"], "ok"), (2, ["1"], "flagged"), (3, ["1"], "ok"), (4, ["2"], "ok"),
        (5, [], "ok")]
    assert ("titan-rocm numerics audit begun at step 1 ended at step 5: 5 parts, flagged at "
            "step(s) 2") in healed.lines
    band = noise_band(clean, [repeat], DEFAULT_TOLERANCE_PCT / 100)
    assert max(abs(v) for v in relative(clean, healed.losses).values) <= band.values[-1]


@pytest.mark.slow
def test_a_quarantined_block_flagged_again_stops_the_run(
        audit_env: Any, monkeypatch: Any, caplog: Any) -> None:
    """Where eager does not clear the flag (here: the switch is made to leave block 0
    compiled, so the fault stays), the recheck at step 2 flags block 0 again and the run stops
    with :class:`NumericsAuditFlagged` (exit code 17), naming the step it was quarantined at."""
    from titan_rocm.adapters.stop import Stopped
    from titan_rocm.workarounds.numerics_audit import quarantine
    from titan_rocm.workarounds.numerics_audit.workaround import NumericsAuditFlagged

    monkeypatch.setattr(quarantine, "_module_switches", lambda prefix, module: [
        quarantine.Switch(module, "forward", lambda original: original, prefix)])
    with pytest.raises(Stopped) as stopped:
        train(audit_env, monkeypatch, caplog, "quarantine", "block=0,graph=forward,fraction=0.03",
              layers=2, extra=SPREAD)
    assert stopped.value.code == 17
    assert isinstance(stopped.value.error, NumericsAuditFlagged)
    assert re.search(
        r"^titan-rocm numerics audit flagged step 2 \(first wrong in the forward: block 0; "
        r"first wrong in the backward: block 0\) and block 0, eager since its quarantine "
        r"at step 1, is still wrong", str(stopped.value.error))


# -- the pieces, on toy modules (no trainer) --------------------------------------------------


def _toy() -> tuple[torch.nn.Module, Any]:
    """A TorchTitan-shaped model: block 0 ``torch.compile``d (an ``OptimizedModule``), block 1
    compiled in place, block 2 eager; and a trainer whose loss is ``torch.compile``d."""
    import types

    model = torch.nn.Module()
    model.tok_embeddings = torch.nn.Embedding(8, 4)
    blocks = {"0": torch.compile(torch.nn.Linear(4, 4)), "1": torch.nn.Linear(4, 4),
              "2": torch.nn.Linear(4, 4)}
    blocks["1"].compile()
    model.layers = torch.nn.ModuleDict(blocks)
    model.norm = torch.nn.LayerNorm(4)
    model.output = torch.nn.Linear(4, 8)

    def loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(pred, labels)

    return model, types.SimpleNamespace(loss_fn=torch.compile(loss), eager_loss=loss)


def test_the_eager_switches_of_each_kind_of_segment_and_their_undoing() -> None:
    """A ``torch.compile``d block's ``forward`` becomes its module's own call, a block compiled
    in place loses its compiled call, an eager block and the (eager) embedding have nothing to
    switch, the head's compiled loss becomes its function; the job's scope puts every one
    back."""
    from titan_rocm import patches
    from titan_rocm.workarounds.numerics_audit import quarantine

    model, trainer = _toy()
    layers = model.layers
    compiled_forward = layers["0"].forward
    found = {seg: quarantine.eager_switches([model], trainer, seg)
             for seg in ("0", "1", "2", "embedding", "head")}
    assert {seg: [s.what for s in sw] for seg, sw in found.items()} == {
        "0": ["layers.0"], "1": ["layers.1"], "2": [], "embedding": [], "head": ["loss_fn"]}
    with patches.scope("job") as scope:
        for switches in found.values():
            for s in switches:
                scope.patch(s.owner, s.name, s.make, by=quarantine.BY)
        assert layers["0"].forward == layers["0"]._orig_mod.__call__
        assert layers["1"]._compiled_call_impl is None
        assert trainer.loss_fn is trainer.eager_loss
        x = torch.randn(2, 4)
        assert torch.equal(layers["0"](x), layers["0"]._orig_mod(x))
    assert layers["0"].forward is compiled_forward
    assert layers["1"]._compiled_call_impl is not None
    assert trainer.loss_fn is not trainer.eager_loss


def test_the_undo_puts_back_grads_buffers_rng_and_the_generations_state() -> None:
    """What the flagged pass changed, put back before the redo: gradients (the copies of any
    there were, None where None), buffers (a token count), the RNG stream, and the seam's
    own state."""
    from titan_rocm.workarounds.numerics_audit import quarantine

    model = torch.nn.Linear(3, 3)
    model.register_buffer("tokens", torch.zeros(3))
    model.weight.grad = torch.ones(3, 3)
    state = {"seen": 5}
    undo = quarantine.Undo([model], torch.device("cpu"),
                           lambda: state.__setitem__("seen", 5))
    expected = torch.rand(4)
    model(torch.randn(2, 3)).sum().backward()
    model.tokens += 7
    state["seen"] = 9
    undo()
    assert torch.equal(model.weight.grad, torch.ones(3, 3)) and model.bias.grad is None
    assert torch.equal(model.tokens, torch.zeros(3)) and state == {"seen": 5}
    assert torch.equal(torch.rand(4), expected)  # the stream as at the snapshot


def test_the_step_clock_compares_unaudited_steps_on_each_side(monkeypatch: Any) -> None:
    """Steps an audit touched are left out; the cost is known once COST_STEPS unaudited steps
    ran after the quarantine, against up to COST_STEPS before it."""
    from titan_rocm.workarounds.numerics_audit import quarantine

    now = [0.0]
    monkeypatch.setattr(quarantine.time, "perf_counter", lambda: now[0])
    clock = quarantine.StepClock()
    for seconds, touched in [(9.0, True), (1.0, False), (1.0, False), (5.0, True)]:
        clock.step_begins()
        clock.touched = touched
        now[0] += seconds
    clock.step_begins()
    clock.quarantined("block 1")  # this step is audited and redone
    now[0] += 7.0
    for _ in range(quarantine.COST_STEPS):
        assert clock.measured() is None
        clock.step_begins()
        now[0] += 1.5
    clock.step_begins()
    assert clock.measured() == (["block 1"], [1.0, 1.0], [1.5] * quarantine.COST_STEPS)
    assert clock.measured() is None


def test_the_quarantines_stop_sentences_read_as_stops() -> None:
    from titan_rocm import audit_message

    again = audit_message.quarantine_failed_line(
        6, "first wrong in the forward: block 2", "block 2", 5)
    cannot = audit_message.unquarantinable_line(
        3, "the end-to-end loss", "only the end-to-end loss is wrong")
    for line in (again, cannot):
        found = audit_message.STOP.search(line)
        assert found and found["step"] in ("6", "3")
        assert not audit_message.QUARANTINED.search(line)
    assert again == ("titan-rocm numerics audit flagged step 6 (first wrong in the forward: "
                     "block 2) and block 2, eager since its quarantine at step 5, is still "
                     'wrong: [rocm] numerics_audit_policy = "quarantine" stops the run')


def _fsdp_run(tmp_path: Path, fault: str | None, port: int) -> tuple[str, dict[int, float]]:
    """5 steps of llama3 debug (two blocks), compiled, FSDP over two gloo ranks in float32,
    under quarantine with whole audits at steps 1 and 4; the log and rank 0's losses."""
    import os
    import subprocess
    import sys

    from titan_rocm.logs.parse import parse_text
    from titan_rocm.testing.corrupt import ENV

    root = TESTS.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get(
        "PYTHONPATH", "")]))
    env.pop(ENV, None)
    if fault is not None:
        env[ENV] = fault
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--tee",
           "3", "--master_port", str(port), "-m", "tests.support.audit_train_main",
           "--model.converters", "rocm", "--compile.enable", "--activation_checkpoint.mode",
           "none", "--training.steps", "5", "--metrics.log_freq", "1",
           "--parallelism.data_parallel_shard_degree", "2",
           "--training.mixed_precision_param", "float32", "--rocm.numerics_audit_policy",
           "quarantine", "--rocm.numerics_audit", "every_n_steps",
           "--rocm.numerics_audit_every", "4", "--rocm.numerics_audit_spread", "1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                          cwd=tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    records = [r for r in parse_text(text).train_records if r.rank in (None, 0)]
    return text, {r.step: r.loss for r in records}


@pytest.mark.slow
def test_fsdp_two_ranks_quarantine_the_same_block_and_train_to_a_clean_runs_loss(
        tmp_path: Path) -> None:
    """FSDP over two gloo ranks (each block an ``OptimizedModule`` that FSDP wraps): 3 % of
    block 1's compiled backward on both ranks is flagged at step 1 (one verdict over the
    ranks), both ranks quarantine block 1 and redo the micro-batch (the redo's reduce-scatter
    is collective: a rank that did not would hang), the recheck at step 2 is ok on both, the
    run ends, and every step's loss is within the band of a clean run (float32 gloo repeats
    are bit-identical)."""

    from tests.support.cpu_support import free_port
    from titan_rocm import audit_message

    clean_text, clean = _fsdp_run(tmp_path, None, free_port())
    assert not audit_message.QUARANTINED.search(clean_text)
    text, healed = _fsdp_run(tmp_path, "block=1,graph=backward,fraction=0.03",
                              free_port())
    lines = [line for line in text.splitlines() if audit_message.QUARANTINED.search(line)]
    assert len(lines) == 2, lines  # one per rank
    assert all("at step 1: quarantined block 1 (first wrong in the backward: block 1" in line
               for line in lines)
    assert text.count("titan-rocm: the quarantined block 1 is ok at step 2 (eager since "
                      "step 1)") == 2
    assert sorted(healed) == sorted(clean) == [1, 2, 3, 4, 5]
    diff, band = within_noise(clean, [clean], healed)
    assert diff <= band, (diff, band, healed, clean)
