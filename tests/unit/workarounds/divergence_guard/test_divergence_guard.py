"""rocm.divergence_guard: the device-side record, the multi-rank verdict, and TorchTitan 0.2.2's
real Trainer.train()/train_step()/MetricsProcessor/CheckpointManager on CPU
(tests/support/cpu_trainer.py).

What the CPU tests show about synchronisation: CPU tensors never make the host wait, so
"no sync" is shown by construction instead: a TorchFunctionMode sees every torch call,
and the tests assert that the guard's code calls nothing that reads a tensor on the host
(``.item()``, ``.tolist()``, ``bool()``, ``.cpu()``, ...) outside its check points. The
``gpu``-marked test repeats that on CUDA with ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.support import cpu_trainer  # noqa: I001 - tests/ is on sys.path (pytest rootdir conftest-less import)
from tests.support.cpu_support import free_port
from titan_rocm.adapters.stop import Stopped
from titan_rocm.exit_codes import FAILED_VALIDATION, stop_line
from titan_rocm.guard_message import message
from titan_rocm.platform import PlatformFacts
from titan_rocm.settings import RocmSettings
from titan_rocm.workarounds.base import Context
from titan_rocm.workarounds.divergence_guard import (
    INJECT_RANK_ENV,
    INJECT_STEP_ENV,
    DivergenceError,
    Injection,
    Monitor,
    hooks,
    seams_tt022,
)
from titan_rocm.workarounds.divergence_guard.record import NonFiniteRecord, Row
from titan_rocm.workarounds.divergence_guard.verdict import decide
from titan_rocm.workarounds.divergence_guard.workaround import DivergenceGuard

GUARD_DIR = str(Path(hooks.__file__).parent)
REPO = Path(__file__).resolve().parents[4]
NAN, INF = float("nan"), float("inf")

# Tensor methods and functions that copy a tensor's value to the host (a sync on a GPU).
SYNCING = {
    "item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__",
    "__repr__", "__format__", "nonzero", "equal", "allclose", "is_nonzero", "unique",
    "masked_select", "__len__",
}


@pytest.fixture(autouse=True)
def _clean_hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for env in (INJECT_STEP_ENV, INJECT_RANK_ENV):
        monkeypatch.delenv(env, raising=False)
    hooks.uninstall()  # a guard applied by another test file's converter must not watch ours
    yield
    hooks.uninstall()


# -- the record -------------------------------------------------------------------------------


def _step(record: NonFiniteRecord, step: int, loss: float | None, gn: float | None) -> None:
    if loss is not None:
        record.observe_loss(torch.tensor(loss * 8), torch.zeros(2, 4, dtype=torch.long))
    if gn is not None:
        record.observe_grad_norm(torch.tensor(gn))
    record.end_step(step)


def test_record_keeps_the_first_bad_step_and_its_values() -> None:
    record = NonFiniteRecord()
    _step(record, 1, 2.5, 1.0)
    assert record.row() == Row(None, None, None)
    _step(record, 2, 2.0, INF)
    _step(record, 3, NAN, NAN)  # sticky: step 2 stays
    row = record.row()
    assert (row.step, row.loss, row.grad_norm) == (2, 2.0, INF)


def test_record_mean_loss_over_micro_batches_and_valid_tokens() -> None:
    record = NonFiniteRecord()
    labels = torch.tensor([[1, 2, -100, -100]])  # 2 valid tokens per micro-batch
    record.observe_loss(torch.tensor(3.0), labels)
    record.observe_loss(torch.tensor(NAN), labels)
    record.end_step(5)
    assert record.row().step == 5 and math.isnan(record.row().loss)
    # zero valid tokens: 0/0 is nan, as TorchTitan's own loss would be
    empty = NonFiniteRecord()
    empty.observe_loss(torch.tensor(0.0), torch.full((1, 4), -100))
    empty.observe_grad_norm(torch.tensor(0.0))
    empty.end_step(1)
    assert empty.row().step == 1


def test_record_without_loss_as_on_a_first_pipeline_stage() -> None:
    record = NonFiniteRecord()
    _step(record, 1, None, 1.0)
    _step(record, 2, None, NAN)
    row = record.row()
    assert row.step == 2 and row.loss is None and math.isnan(row.grad_norm)


class _Calls(TorchFunctionMode):
    """Records the name of every torch function/method called while active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_record_updates_call_no_host_read() -> None:
    """Every op the per-step path uses is a device op; reading the row is the only sync."""
    record = NonFiniteRecord()
    with _Calls() as calls:
        for step in range(1, 4):
            _step(record, step, NAN if step == 2 else 1.0, 1.0)
    assert calls.names, "the mode saw nothing: the check below would prove nothing"
    assert SYNCING.isdisjoint(calls.names), sorted(SYNCING.intersection(calls.names))
    with _Calls() as calls:
        record.row()
    assert "tolist" in calls.names  # positive control: the detector sees host reads


# -- verdict ----------------------------------------------------------------------------------


def test_decide_earliest_step_then_lowest_rank_and_fills_pp_loss() -> None:
    rows = [Row(None, None, None), Row(9, 1.0, NAN), Row(7, None, NAN), Row(7, 2.0, NAN)]
    v = decide(rows, "log step 10")
    assert (v.step, v.rank, v.ranks_bad) == (7, 2, (1, 2, 3))
    assert v.loss == 2.0  # rank 2 (a first PP stage) saw no loss: filled from rank 3
    # FSDP: the grad norm is NaN on every rank; the rank whose loss went NaN is named
    fsdp = decide([Row(7, 6.18, NAN), Row(7, NAN, NAN)], "log step 10")
    assert fsdp.rank == 1 and math.isnan(fsdp.loss)
    text = message(fsdp)
    assert "step 7 on rank 1 of 2 (non-finite by now on rank(s) 0 too)" in text
    text = message(v)
    for needle in ("step 7", "rank 2 of 4", "loss = 2", "grad_norm = nan", "log step 10",
                   "docs/divergence-detection.md", "max_norm", "divergence_check"):
        assert needle in text
    assert decide([Row(None, None, None)] * 3, "x") is None


def test_injection_env_parsing() -> None:
    assert Injection.from_env({}) is None
    assert Injection.from_env({INJECT_STEP_ENV: "7"}) == Injection(7, None)
    assert Injection.from_env({INJECT_STEP_ENV: "7", INJECT_RANK_ENV: "1"}) == Injection(7, 1)
    for bad in ({INJECT_STEP_ENV: "seven"}, {INJECT_STEP_ENV: "0"},
                {INJECT_STEP_ENV: "3", INJECT_RANK_ENV: "-1"}):
        with pytest.raises(ValueError, match=INJECT_STEP_ENV):
            Injection.from_env(bad)


def test_monitor_rejects_unknown_check_mode() -> None:
    with pytest.raises(ValueError, match="every_step"):
        Monitor("sometimes")


def test_host_values_at_a_log_step_stop_even_when_nothing_was_observed() -> None:
    """A loss the guard cannot observe (a custom loss fn) still stops at the log step."""
    monitor = Monitor()
    monitor.on_step_end()
    monitor.on_log(1, 2.0, 1.0)  # clean
    with pytest.raises(DivergenceError) as err:
        monitor.on_log(2, NAN, 1.0)
    assert err.value.divergence.step == 2 and math.isnan(err.value.divergence.loss)


# -- the converter ----------------------------------------------------------------------------


def _ctx(**settings: Any) -> Context:
    facts = PlatformFacts(
        torch_version="2.13", hip_version=None, cuda_version=None, device_count=0,
        gcn_arch_name=None, device_capability=None, device_name=None, triton_version=None,
        aiter_spec_found=False,
    )
    return Context(settings=RocmSettings(**settings), platform=facts)


def test_guard_applies_by_default_off_rocm_and_can_be_turned_off() -> None:
    model = torch.nn.Linear(2, 2)
    assert DivergenceGuard.needs_rocm is False
    assert DivergenceGuard(_ctx()).gate(model) is None
    assert "disabled" in DivergenceGuard(_ctx(divergence_guard="off")).gate(model)


def test_plan_names_the_check_points() -> None:
    guard = DivergenceGuard(_ctx(divergence_check="every_step"))
    assert guard.plan(torch.nn.Linear(2, 2))["check"] == "every_step"
    said = {mode: DivergenceGuard(_ctx(divergence_check=mode)).plan(torch.nn.Linear(2, 2))[
        "checked_at"] for mode in ("log_steps", "every_step", "every_step_exact")}
    assert "one step late" in said["every_step"] and "no wait" in said["every_step"]
    assert "one device sync per step" in said["every_step_exact"]
    assert "no extra sync" in said["log_steps"]


def test_bad_injection_env_fails_at_converter_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INJECT_STEP_ENV, "x")
    with pytest.raises(ValueError, match=INJECT_STEP_ENV):
        DivergenceGuard(_ctx())


def test_loss_wrapper_sees_a_real_non_finite_loss_with_finite_gradients() -> None:
    """TorchTitan's real cross_entropy_loss, wrapped: an inf loss whose grads stay finite."""
    import torchtitan.components.loss as loss_module

    monitor = Monitor()
    seams_tt022.install(monitor)
    loss_fn = loss_module.build_cross_entropy_loss(cpu_trainer.job_config([]))
    logits = torch.zeros(1, 2, 4)
    logits[0, 0, 0] = -INF  # the target's logit: loss = +inf, but softmax - onehot is finite
    pred = logits.requires_grad_()
    labels = torch.tensor([[0, 1]])
    with torch.no_grad():  # validation: not observed
        loss_fn(pred, labels)
    assert not monitor.record.saw_loss
    loss = loss_fn(pred, labels)
    loss.backward()
    assert math.isinf(loss.item()) and torch.isfinite(pred.grad).all()
    monitor.on_step_end()
    assert monitor.record.row().step == 1 and monitor.record.row().loss == INF


# -- TorchTitan's real Trainer on CPU -------------------------------------------------------


class _SyncWatch(TorchFunctionMode):
    """Host reads whose nearest non-torch caller is the guard's code, outside Monitor.check."""

    def __init__(self) -> None:
        super().__init__()
        self.outside_check: list[str] = []
        self.inside_check = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        name = getattr(func, "__name__", "")
        if name in SYNCING:
            frame = sys._getframe(1)
            caller = None
            in_check = False
            while frame is not None:
                path = frame.f_code.co_filename
                if caller is None and "/torch/" not in path:
                    caller = path
                if path.startswith(GUARD_DIR) and frame.f_code.co_name == "check":
                    in_check = True
                frame = frame.f_back
            if caller is not None and caller.startswith(GUARD_DIR):
                if in_check:
                    self.inside_check += 1
                else:
                    self.outside_check.append(f"{name} from {caller}")
        return func(*args, **(kwargs or {}))


def _trainer(monkeypatch: pytest.MonkeyPatch, args: list[str], data_batches: int | None = None):
    cpu_trainer.cpu_patches(monkeypatch.setattr)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # train()'s 2 s end-of-run pause
    monkeypatch.setattr(cpu_trainer.CpuTrainer, "patch_for_cpu", False)
    monkeypatch.setattr(cpu_trainer.CpuTrainer, "data_batches", data_batches)
    return cpu_trainer.CpuTrainer(cpu_trainer.job_config(args))


def _run(trainer: Any) -> None:
    """What torchtitan.train.main does around a trainer: train(), then close(). A stop ends
    the rank as the process would end (exit code 17, the process group destroyed); the
    guard's DivergenceError that caused it is raised here for the test to read."""
    try:
        try:
            trainer.train()
        except Exception:
            trainer.close()
            raise
        trainer.close()
    except Stopped as stopped:
        assert stopped.code == FAILED_VALIDATION == 17
        assert not torch.distributed.is_initialized()
        assert isinstance(stopped.error, DivergenceError)
        raise stopped.error from None


GUARD = ["--model.converters", "rocm.divergence_guard"]


LAGGED_AT_8 = ("the end of step 8 (divergence_check = every_step reads each step's record "
               "at the end of the next)")


@pytest.mark.parametrize("mode,found_at,stop_step,checks", [
    # Log steps 1 and 10: no other check point was hit.
    ("log_steps", "log step 10", 10, 2),
    # One step late, still exact. Log step 1 read step 1's copy (TorchTitan's .item() had
    # waited for it), so the end of step 2 had nothing to read; the ends of steps 3-8 read
    # steps 2-7.
    ("every_step", LAGGED_AT_8, 8, 7),
])
def test_real_trainer_nan_at_step_7_named_without_syncs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, mode: str,
    found_at: str, stop_step: int, checks: int,
) -> None:
    monkeypatch.setenv(INJECT_STEP_ENV, "7")
    trainer = _trainer(monkeypatch, GUARD + ["--rocm.divergence_check", mode])  # log_freq 10
    monitor = hooks.active()
    assert monitor is not None
    with _SyncWatch() as watch, pytest.raises(DivergenceError) as err:
        _run(trainer)
    v = err.value.divergence
    assert (v.step, v.checked_at) == (7, found_at)
    assert math.isnan(v.loss) and math.isnan(v.grad_norm)  # multiplied: grads went NaN too
    assert trainer.step == stop_step  # stopped at the check point, before the next step
    assert monitor.checks == checks
    assert watch.outside_check == []  # no host read by the guard between check points
    assert watch.inside_check >= checks  # positive control: the detector sees the checks' reads
    assert sum("training diverged at step 7" in r.getMessage() for r in caplog.records) == 1


class _Order(TorchFunctionMode):
    """The order of the guard's snapshot gathers and TorchTitan's own ``.item()`` reads."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        name = getattr(func, "__name__", "")
        if name in ("clone", "item"):
            frame = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            path = frame.f_code.co_filename if frame is not None else ""
            if name == "clone" and path.endswith("divergence_guard/snapshot.py"):
                self.events.append("snapshot")
            elif name == "item" and path.endswith("torchtitan/train.py"):
                self.events.append("trainer .item()")
        return func(*args, **(kwargs or {}))


def test_real_trainer_log_steps_copy_the_rows_before_torchtitan_waits(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows' copy is enqueued at ``should_log``, before the trainer's own ``.item()``.

    On a GPU that ordering is what makes the log-step read free: the trainer's ``.item()``
    waits for the stream, copy included (tests/gpu shows the event complete on CUDA).
    """
    trainer = _trainer(monkeypatch, GUARD)  # log_freq 10, 12 steps: log steps 1 and 10
    monitor = hooks.active()
    with _Order() as order:
        _run(trainer)
    runs = [e for i, e in enumerate(order.events) if i == 0 or order.events[i - 1] != e]
    # Log steps 1 and 10: the copy first, then the trainer's reads (loss, grad norm). The end
    # of training (steps 11-12) has no trainer read to lean on: it gathers and reads itself.
    assert runs == ["snapshot", "trainer .item()"] * 2 + ["snapshot"], order.events
    assert monitor.checks == 3 and monitor.pending is None


def test_snapshot_read_waits_only_for_a_copy_still_in_flight() -> None:
    """The event logic of :class:`Snapshot` with a stand-in event (CPU has no streams)."""
    from titan_rocm.workarounds.divergence_guard.snapshot import Snapshot

    class Event:
        def __init__(self, done: bool) -> None:
            self.done, self.waited_on = done, 0

        def query(self) -> bool:
            return self.done

        def synchronize(self) -> None:
            self.waited_on += 1
            self.done = True

    row = torch.tensor([[7.0, NAN, 1.0, 1.0, 1.0]], dtype=torch.float64)
    landed = Snapshot(10, 10, row, Event(done=True))
    assert landed.rows()[0].step == 7 and not landed.waited and landed.event.waited_on == 0
    in_flight = Snapshot(10, 10, row, Event(done=False))
    assert not in_flight.ready()
    assert in_flight.rows()[0].step == 7 and in_flight.waited
    assert in_flight.event.waited_on == 1


def test_monitor_reads_afresh_when_the_snapshot_is_of_another_step() -> None:
    """A snapshot taken at step 1's ``should_log`` must not answer for step 2's log."""
    monitor = Monitor()
    monitor.record.observe_loss(torch.tensor(2.0))
    monitor.on_step_end()  # step 1: clean
    monitor.on_should_log(1)  # the rows' copy: clean
    assert monitor.pending is not None and monitor.pending.step == 1
    monitor.record.observe_loss(torch.tensor(NAN))
    monitor.on_step_end()  # step 2: bad, after the copy was taken
    with pytest.raises(DivergenceError) as err:
        monitor.on_log(2, 2.0, 1.0)  # trusting the stale, clean copy would let this pass
    assert err.value.divergence.step == 2
    assert monitor.checks == 1 and monitor.pending is None
    assert monitor.waits == 0  # CPU: nothing to wait for


def test_real_trainer_every_step_exact_mode_stops_at_the_bad_step(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(INJECT_STEP_ENV, "7")
    trainer = _trainer(monkeypatch, GUARD + ["--rocm.divergence_check", "every_step_exact"])
    with pytest.raises(DivergenceError) as err:
        _run(trainer)
    assert err.value.divergence.step == 7 and "end of step 7" in err.value.divergence.checked_at
    assert trainer.step == 7
    # One read per step; log step 1 reads nothing more (its step was read at its end).
    assert hooks.active().checks == 7


EVERY_STEP = GUARD + ["--rocm.divergence_check", "every_step"]


def test_real_trainer_every_step_catches_a_nan_at_the_last_step(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last step has no next step: its copy is read before the end-of-training save."""
    monkeypatch.setenv(INJECT_STEP_ENV, "12")
    trainer = _trainer(monkeypatch, EVERY_STEP)  # 12 steps
    with pytest.raises(DivergenceError) as err:
        _run(trainer)
    assert err.value.divergence.step == 12
    assert err.value.divergence.checked_at == "the checkpoint save at step 12"  # last step
    assert trainer.step == 12


class _Device:
    """A stand-in device that runs ``behind`` host steps behind the host, for the guard's own
    wait counter (CPU has no streams): a copy enqueued at host step N has landed once the
    host reaches step N + ``behind``."""

    def __init__(self, behind: int) -> None:
        self.behind = behind
        self.host_step = 0
        self.waited_for: list[int] = []

    def event(self, enqueued_at: int) -> Any:
        device = self

        class Event:
            def query(self) -> bool:
                return device.host_step >= enqueued_at + device.behind

            def synchronize(self) -> None:
                device.waited_for.append(enqueued_at)

        return Event()


def _steady_state(monkeypatch: pytest.MonkeyPatch, mode: str, behind: int, steps: int = 20):
    """Run ``steps`` steps of the Monitor alone (no trainer), every snapshot on ``_Device``."""
    from titan_rocm.workarounds.divergence_guard.snapshot import Snapshot

    device = _Device(behind)
    take = Snapshot.take.__func__

    def take_on_device(cls: type, record: NonFiniteRecord, step: int, where: Any) -> Snapshot:
        snapshot = take(cls, record, step, where)
        snapshot.event = device.event(device.host_step)
        return snapshot

    monkeypatch.setattr(Snapshot, "take", classmethod(take_on_device))
    monitor = Monitor(mode)
    for step in range(1, steps + 1):
        device.host_step = step
        monitor.record.observe_loss(torch.tensor(2.0))
        monitor.record.observe_grad_norm(torch.tensor(1.0))
        monitor.on_step_end()
    return monitor, device


def test_every_step_waits_for_nothing_in_steady_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device one step behind the host: every_step's reads find their copy landed, while
    every_step_exact waits at every step (the 10 % it costs on a GPU-bound model)."""
    lagged, device = _steady_state(monkeypatch, "every_step", behind=1)
    assert lagged.checks == 19 and lagged.waits == 0 and device.waited_for == []
    assert lagged.checked_through == 19  # the end of step 20 read step 19's record
    exact, device = _steady_state(monkeypatch, "every_step_exact", behind=1)
    assert exact.checks == 20 and exact.waits == 20  # positive control: the counter counts


def test_every_step_never_waits_for_its_own_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device two steps behind: the read at the end of step N+1 waits, for step N's copy,
    while step N+1's work is already queued behind it; never for step N+1's own."""
    monitor, device = _steady_state(monkeypatch, "every_step", behind=2, steps=6)
    assert monitor.waits == 5 and device.waited_for == [1, 2, 3, 4, 5]


def test_real_trainer_clean_run_completes_and_checks_the_tail(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = _trainer(monkeypatch, GUARD)
    _run(trainer)
    monitor = hooks.active()
    assert trainer.step == 12 and monitor.divergence is None
    assert monitor.checks == 3  # log steps 1 and 10, then steps 11-12 at the end of training


@pytest.mark.parametrize("mode,bad_step", [
    ("log_steps", 7),
    # every_step, NaN at step 8 with a save due at step 8: step 8's copy is read before the
    # save, not at the end of step 9 (which would be one checkpoint too late).
    ("every_step", 8),
])
def test_real_trainer_never_saves_a_checkpoint_from_a_bad_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str, bad_step: int
) -> None:
    monkeypatch.setenv(INJECT_STEP_ENV, str(bad_step))
    trainer = _trainer(monkeypatch, GUARD + [
        "--checkpoint.enable", "--checkpoint.interval", "4", "--rocm.divergence_check", mode,
        "--job.dump_folder", str(tmp_path), "--checkpoint.folder", "ckpt",
    ])
    with pytest.raises(DivergenceError) as err:
        _run(trainer)
    assert err.value.divergence.step == bad_step
    assert err.value.divergence.checked_at == "the checkpoint save at step 8"
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert saved == ["step-4"]  # the last good checkpoint; step 8 was never written


@pytest.mark.parametrize("mode,bad_step", [("log_steps", 8), ("every_step", 9)])
def test_real_trainer_run_out_of_data_is_checked_at_close(
    monkeypatch: pytest.MonkeyPatch, mode: str, bad_step: int
) -> None:
    """The loop can end without a log step or a last-step save; close() still checks (under
    every_step: it reads the last step's copy, which no next step will)."""
    monkeypatch.setenv(INJECT_STEP_ENV, str(bad_step))
    trainer = _trainer(monkeypatch, GUARD + ["--rocm.divergence_check", mode],
                       data_batches=9)  # step 10 has no data
    with pytest.raises(DivergenceError) as err:
        _run(trainer)
    assert err.value.divergence.step == bad_step
    assert err.value.divergence.checked_at == "the end of training"


def test_real_trainer_without_guard_diverges_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    """The problem the guard solves: the same kind of run ends 'successfully'."""
    trainer = _trainer(monkeypatch, [
        "--training.steps", "4", "--metrics.log_freq", "1", "--optimizer.lr", "1e6",
        "--training.max_norm", "1e30", "--lr_scheduler.warmup_steps", "0",
    ])
    _run(trainer)
    assert trainer.step == 4 and hooks.active() is None


@pytest.mark.slow
@pytest.mark.parametrize("mode,found_at", [
    ("log_steps", "(found at log step 10)"),
    ("every_step", "(found at the end of step 8 "),  # every rank gathers at every step end
])
def test_two_ranks_both_stop_and_rank_0_reports_once(tmp_path: Path, mode: str,
                                                      found_at: str) -> None:
    """torchrun, 2 processes over gloo, NaN on rank 1 only: no rank hangs."""
    env = dict(os.environ, **{INJECT_STEP_ENV: "7", INJECT_RANK_ENV: "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--tee", "3",
           "--master_port", str(free_port()),
           str(REPO / "tests" / "support" / "cpu_trainer.py"), *GUARD,
           "--rocm.divergence_check", mode]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert time.monotonic() - start < 200
    errors = [ln for ln in out.splitlines() if "ERROR - titan-rocm divergence guard" in ln]
    full = [ln for ln in errors if ln.startswith("[default0]:")]
    assert len(full) == 1 and "diverged at step 7 on rank 1 of 2" in full[0], errors
    assert found_at in full[0], full[0]
    # Rank 1 logs the summary its stop carries, once: its own log says why it stopped.
    (summary,) = [ln for ln in errors if ln.startswith("[default1]:")]
    assert "diverged at step 7 (first seen on rank 1)" in summary, summary
    # Every rank ends as a stop (exit code 17 in torchrun's failure record), no traceback of
    # its own; torchrun's own ChildFailedError is its one (tests/tt022/test_stop_exit_code.py).
    workers = [ln for ln in out.splitlines() if ln.startswith("[default")]
    assert not [ln for ln in workers if "Traceback" in ln or "DivergenceError" in ln]
    # The root cause is 17; torchrun sends SIGTERM to a rank still leaving after the first.
    codes = re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", out, re.M)
    assert "17" in codes and len(codes) == 2 and set(codes) <= {"17", "-15"}, out[-3000:]
    for rank in (0, 1):
        assert f"[default{rank}]:" in out and stop_line() in "\n".join(
            ln for ln in workers if ln.startswith(f"[default{rank}]:"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_record_updates_never_sync_on_gpu() -> None:
    record = NonFiniteRecord()
    loss = torch.tensor(4.0, device="cuda")
    labels = torch.ones(2, 4, dtype=torch.long, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 20):
            record.observe_loss(loss * (NAN if step == 7 else 1.0), labels)
            record.observe_grad_norm(loss)
            record.end_step(step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert record.row().step == 7


def test_compiled_loss_keeps_one_graph_and_the_bookkeeping_eager() -> None:
    """``[compile] components`` with "loss": the wrapper is compiled; the guard's part is not."""
    import torch._dynamo
    import torchtitan.components.loss as loss_module
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    monitor = Monitor(injection=Injection(3, None))
    seams_tt022.install(monitor)
    jc = cpu_trainer.job_config(["--compile.enable", "--compile.backend", "aot_eager"])
    loss_fn = loss_module.build_cross_entropy_loss(jc)
    for step in range(1, 6):
        pred = torch.randn(2, 4, 8, requires_grad=True)
        loss = loss_fn(pred, torch.randint(0, 8, (2, 4)))
        loss.backward()
        assert bool(torch.isfinite(pred.grad).all()) == (step != 3)  # NaN grads at step 3
        monitor.on_step_end()
    assert monitor.record.row().step == 3
    assert counters["stats"]["unique_graphs"] == 1  # no recompile as the step changes
