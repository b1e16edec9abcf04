"""``rocm.numerics_audit``: the numerics audit inside a real training run (docs/numerics-audit.md).

Everything the replayed micro-batch touches is given back, so the trajectory is what it would have
been without it; a failed audit is one logged warning, never the end of the run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn as nn

from titan_rocm import audit_message, patches
from titan_rocm.log import log
from titan_rocm.numerics.audit import Audit
from titan_rocm.numerics.audit_run import StepKit
from titan_rocm.numerics.report import format_report
from titan_rocm.numerics.result import AuditError, Part, spread
from titan_rocm.numerics.state import out_of_memory
from titan_rocm.numerics.stats import AuditSettings
from titan_rocm.workarounds.base import RunStopped, TrainerSeam, Workaround
from titan_rocm.workarounds.numerics_audit import quarantine
from titan_rocm.workarounds.numerics_audit.quarantine import label


class AuditSeam(Protocol):
    """What the audit needs of one TorchTitan generation."""

    def install(self, audit: NumericsAudit) -> TrainerSeam | None:
        """Route the trainer and each ``forward_backward_step`` through this audit; return the
        trainer seam, if the generation has one."""

    def kit(self, trainer: Any, denominator: Any) -> StepKit:
        """The trainer's step on one micro-batch with the loss denominator ``denominator``."""

    def kept(self, trainer: Any) -> Callable[[], None]:
        """What the generation's step changes on the trainer besides the model (a count of
        tokens seen), taken now; calling the result puts it back (before a redone pass)."""


class NumericsAuditFlagged(RunStopped):
    """Flagged under ``numerics_audit_policy = "stop"`` (or quarantine could not clear it): every
    rank exits with :data:`titan_rocm.exit_codes.FAILED_VALIDATION` before the optimizer step."""


class NumericsAudit(Workaround):
    """Audits the compiled step block by block at the steps it is set to."""

    name = "numerics_audit"
    needs_rocm = False
    has_seam = True
    seam: AuditSeam

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.trainer: Any = None
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.auditing = False
        self.pending: list[Part] = []
        """The parts of the audit under way still to run, one per step."""
        self.outcomes: list[tuple[int, str]] = []
        """(step, verdict or ``skipped``) of each part of the audit under way."""
        self.results: list[dict[str, Any]] = []
        """Every audit's ``to_dict`` (tests, and anyone holding the converter)."""
        self.quarantined: dict[str, int] = {}
        """Segment -> the step it was quarantined at."""
        self.unconfirmed: set[str] = set()
        """Quarantined segments no audit has replayed since."""
        self.clock = quarantine.StepClock()
        self.scope: patches.Scope | None = None

    def check(self, model: nn.Module) -> str | None:
        if self.ctx.parallel.pp_enabled:
            return ("pipeline parallelism is not audited (each stage holds other blocks and "
                    "its schedule splits the batch)")
        if self.ctx.parallel.cp_enabled:
            return ("context parallelism is not audited (a block's replay runs outside the "
                    "ring attention context)")
        return None

    def apply(self, model: nn.Module) -> None:
        self.scope = patches.current()
        self.trainer_seam = self.seam.install(self)

    def plan(self, model: nn.Module) -> dict[str, Any]:
        s = self.ctx.settings
        when = ("from the first step" if s.numerics_audit == "first_step" else
                f"from the first step and every {s.numerics_audit_every} steps")
        over = ("each audit in one step" if s.numerics_audit_spread == 1 else
                f"each audit spread over up to {s.numerics_audit_spread} steps (its blocks "
                "dealt over all but the last, which compares the embedding, the head and "
                "the end-to-end loss)")
        return {"when": f"{when}, {over}", "policy": s.numerics_audit_policy,
                "reference": s.numerics_audit_reference}

    def attach(self, trainer: Any) -> None:
        """Keep the trainer whose steps are audited."""
        self.trainer = trainer

    def due(self, step: int) -> bool:
        """Whether step ``step`` is audited."""
        s = self.ctx.settings
        if self.first_step is None:
            self.first_step = step
        if step == self.first_step:
            return True
        return s.numerics_audit == "every_n_steps" and step % s.numerics_audit_every == 0

    def forward_backward(self, step: int, run: Callable[[], Any], input_dict: Any,
                         labels: Any, denominator: Any) -> Any:
        """One ``forward_backward_step``, audited when it is the step's first micro-batch and an
        audit is due."""
        first = step != self.last_step
        self.last_step = step
        if first and not self.auditing and self.ctx.settings.numerics_audit_policy == \
                "quarantine":
            self.clock.step_begins()
            self._cost()
        if self.auditing or self.trainer is None or not first:
            return run()
        due = self.due(step)
        if due and self.pending:
            log.info("titan-rocm: the numerics audit due at step %d is not started: the one "
                     "begun at step %d has %d part(s) to run (numerics_audit_spread %d)", step,
                     self.outcomes[0][0], len(self.pending),
                     self.ctx.settings.numerics_audit_spread)
        if not due and not self.pending:
            return run()
        self.auditing = True
        try:
            return self._audited(step, run, input_dict, labels, denominator)
        finally:
            self.auditing = False

    def _audited(self, step: int, run: Callable[[], Any], input_dict: Any, labels: Any,
                 denominator: Any) -> Any:
        trainer = self.trainer
        settings = self.ctx.settings
        facts = self.ctx.job.audit_facts(trainer.model_parts) if self.ctx.job else None
        audit = Audit(trainer.model_parts, torch.device(getattr(trainer, "device", "cpu")),
                      self.seam.kit(trainer, denominator), AuditSettings.of(settings), facts,
                      reference=settings.numerics_audit_reference,
                      submodules=settings.numerics_audit_submodules)
        try:
            audit.prepare()
        except AuditError as exc:
            self.pending = []
            log.warning("%s", audit_message.skipped_line(step, str(exc)))
            return run()
        if not self.pending:
            self.pending = spread(audit.block_keys, settings.numerics_audit_spread)
            self.outcomes = []
        audit.select(self.pending.pop(0))
        self.clock.touched = True
        undo = (quarantine.Undo(trainer.model_parts, audit.device, self.seam.kept(trainer))
                if settings.numerics_audit_policy == "quarantine" else None)
        with audit.recording():
            loss = run()
        try:
            result = audit.finish(input_dict, labels, loss).to_dict()
        except Exception as exc:  # noqa: BLE001 - an audit never ends the run: one warning
            reason = str(exc) if isinstance(exc, AuditError) else (
                f"{'out of memory' if out_of_memory(exc) else type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            log.warning("%s", audit_message.skipped_line(step, reason))
            self._ended(step, "skipped")
            return loss
        result["step"] = step
        self.results.append(result)
        text = format_report(result, step=step)
        if result["verdict"] == "ok":
            log.info("%s", text)
            self._confirmed(step, result)
            self._ended(step, "ok")
            return loss
        log.warning("%s", text)
        self._ended(step, "flagged")
        if settings.numerics_audit_policy == "stop":
            raise NumericsAuditFlagged(audit_message.stopped_line(step, _where(result)))
        if undo is not None:
            self._confirmed(step, result)
            return self._quarantine(step, result, text, audit, undo, run, loss)
        return loss

    def _ended(self, step: int, outcome: str) -> None:
        """One part ended; after the last part of a spread audit, one line for the whole."""
        self.outcomes.append((step, outcome))
        if self.pending or len(self.outcomes) < 2:
            return
        log.info("%s", audit_message.complete_line(self.outcomes))


    # -- numerics_audit_policy = "quarantine" ------------------------------------------------

    def _confirmed(self, step: int, result: dict[str, Any]) -> None:
        """A quarantined segment this audit replayed: ok (one line), or flagged again (the
        run stops: eager did not clear it)."""
        for seg in result.get("segments") or []:
            name = seg["segment"]
            if name not in self.quarantined:
                continue
            wrong = seg["forward"]["flagged"] or seg["backward"]["flagged"]
            if wrong:
                raise NumericsAuditFlagged(audit_message.quarantine_failed_line(
                    step, _where(result), label(name), self.quarantined[name]))
            if name in self.unconfirmed:
                self.unconfirmed.discard(name)
                log.info("titan-rocm: the quarantined %s is ok at step %d (eager since step "
                         "%d)", label(name), step, self.quarantined[name])

    def _quarantine(self, step: int, result: dict[str, Any], text: str, audit: Audit,
                    undo: quarantine.Undo, run: Callable[[], Any], loss: Any) -> Any:
        """Make the flagged segments eager and run the flagged micro-batch again from where
        it started; its loss is the step's."""
        wrong = [s["segment"] for s in result.get("segments") or []
                 if s["forward"]["flagged"] or s["backward"]["flagged"]]
        if not wrong:
            raise NumericsAuditFlagged(audit_message.unquarantinable_line(
                step, _where(result), "only the end-to-end loss is wrong, which names no "
                "segment to take out of compilation"))
        switches = {name: quarantine.eager_switches(self.trainer.model_parts, self.trainer,
                                                    name) for name in wrong}
        eager = [name for name, found in switches.items() if not found]
        if eager:
            raise NumericsAuditFlagged(audit_message.unquarantinable_line(
                step, _where(result), f"nothing of {', '.join(label(n) for n in eager)} is "
                "compiled, so running it eager changes nothing"))
        scope = self.scope or patches.current()
        for found in switches.values():
            for switch in found:
                scope.patch(switch.owner, switch.name, switch.make, by=quarantine.BY)
        before_s = float((result.get("time_s") or {}).get("job") or 0.0)
        del loss
        undo()
        quarantine.synchronize(audit.device)
        t0 = time.perf_counter()
        redone = run()
        quarantine.synchronize(audit.device)
        after_s = time.perf_counter() - t0
        for name in wrong:
            self.quarantined[name] = step
            self.unconfirmed.add(name)
            self.clock.quarantined(label(name))
            log.warning("%s", audit_message.quarantined_line(
                step, label(name), _why(text, name), before_s, after_s))
        self._recheck(audit.block_keys, wrong)
        return redone

    def _recheck(self, keys: list[str], segments: list[str]) -> None:
        """Have the next step replay the quarantined segments, unless a part still to run
        replays them already."""
        parts = spread(keys, self.ctx.settings.numerics_audit_spread)
        wanted = [p for p in parts if any(
            (name in p.blocks) or (p.outside and name in ("embedding", "head"))
            for name in segments)]
        pending = {(p.blocks, p.outside) for p in self.pending}
        new = [p for p in wanted if (p.blocks, p.outside) not in pending]
        if new and not self.pending:
            self.outcomes = []
        self.pending[:0] = new

    def _cost(self) -> None:
        """Once enough unaudited steps ran after a quarantine, its cost (one line)."""
        measured = self.clock.measured()
        if measured is None:
            return
        segments, before, after = measured
        what = " and ".join(segments)
        if not before:
            log.info("titan-rocm: the step time before the quarantine of %s is not known (no "
                     "unaudited step ran before it); %.3f s since, mean of %d unaudited "
                     "step(s)", what, quarantine.mean(after), len(after))
            return
        log.info("%s", audit_message.quarantine_cost_line(what, len(after),
                                                          quarantine.mean(before),
                                                          quarantine.mean(after)))


def _why(text: str, segment: str) -> str:
    """The flag's first line naming ``segment`` (the report's ``first wrong ...`` line, with
    the block's child after a comma when one is named), else its first line under the
    verdict."""
    lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
    named = [line for line in lines if line.startswith("first wrong")
             and (f": {label(segment)}:" in line or f": {label(segment)}, " in line)]
    return (named or lines or ["flagged"])[0]


def _where(result: dict[str, Any]) -> str:
    first = result.get("first_wrong") or {}
    parts = [f"first wrong in the {d}: {_label(first[d])}" for d in ("forward", "backward")
             if first.get(d)]
    return "; ".join(parts) or "the end-to-end loss"


def _label(segment: str) -> str:
    return segment if segment in ("embedding", "head") else f"block {segment}"
