"""One job's workarounds, decided once before any applies, then applied in order; apart from
:mod:`.base` so the base does not import the registry (which imports every workaround)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch.nn as nn

from titan_rocm import patches
from titan_rocm.log import log, log_once
from titan_rocm.numerics.attribution import JobFacts
from titan_rocm.workarounds.base import Context, Workaround, close_after_plan
from titan_rocm.workarounds.registry import workaround_class

CORRUPT_ENV = "TITAN_ROCM_DEBUG_CORRUPT"
"""The test fault's variable (``titan_rocm.testing.corrupt.ENV``; the runtime never imports
test-only code)."""


@dataclass
class Decision:
    """What a converter did with one workaround, for logs and ``titan-rocm plan``."""

    workaround: str
    converter: str
    applied: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def line(self) -> str:
        """The log line."""
        status = "applied" if self.applied else f"skipped: {self.reason}"
        return f"titan-rocm: rocm.{self.workaround} {status}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


class JobWorkarounds:
    """The workarounds one job runs, all decided before any applies (so :meth:`Context.will_apply`
    answers for each), then applied once each."""

    def __init__(
        self,
        ctx: Context,
        names: Sequence[str],
        instances: Mapping[str, Workaround] | None = None,
    ) -> None:
        """Build (or adopt from ``instances``) one workaround per name, in apply order."""
        given = instances or {}
        self.ctx = ctx
        self.instances: dict[str, Workaround] = {
            name: given.get(name) or workaround_class(name)(ctx) for name in names
        }
        self.applied_by: dict[str, str] = {}
        """Workaround name -> who applied it (a converter name)."""
        self.decided = False
        self.patches = patches.Scope(f"job ({ctx.framework})")
        """What this job's workarounds patched (:mod:`titan_rocm.patches`); released by
        :meth:`close`."""
        ctx.job = self
        close_after_plan(self.close)

    def adopt(self, instances: Mapping[str, Workaround], model: nn.Module) -> None:
        """Take in workarounds this job did not know yet (decided at once if the job was)."""
        for name, w in instances.items():
            if name not in self.instances:
                self.instances[name] = w
                if self.decided:
                    self.ctx.job_decisions[name] = w.gate(model)

    def require(self) -> None:
        """Start-up check of every ``on`` workaround (ValueError naming what is missing)."""
        for w in self.instances.values():
            w.require()

    def decide(self, model: nn.Module) -> dict[str, str | None]:
        """Gate every workaround once; the answers go to ``ctx.job_decisions``."""
        if not self.decided:
            self.ctx.job_decisions.update({n: w.gate(model) for n, w in self.instances.items()})
            self.decided = True
        return self.ctx.job_decisions

    def apply_all(self, names: Iterable[str], model: nn.Module, by: str) -> list[Decision]:
        """:meth:`apply` each of ``names`` in order, logging one line per decision."""
        if os.environ.get(CORRUPT_ENV, "").strip():
            log_once(f"{CORRUPT_ENV}:training", logging.WARNING,
                     "titan-rocm: %s is set: only titan-rocm audit and the tests install the "
                     "test fault, and they log it when they do; training runs without it "
                     "(docs/numerics-audit-fault.md)", CORRUPT_ENV)
        decisions = []
        for name in names:
            decision = self.apply(name, model, by)
            log.info("%s", decision.line)
            decisions.append(decision)
        return decisions

    def audit_facts(self, model_parts: Sequence[nn.Module]) -> JobFacts:
        """What applied, as the numerics audit attributes it."""
        applied = [name for name in self.instances if name in self.applied_by]
        notes = [note for name in applied
                 if (note := self.instances[name].audit_note()) is not None]
        shapes = {name: shape for name in applied
                  if (shape := self.instances[name].audit_shapes) is not None}
        blocks = {name: self.instances[name].audit_blocks(list(model_parts))
                  for name, shape in shapes.items() if shape == "listed"}
        return JobFacts(applied, notes, shapes, blocks)

    def applied(self, by: str | None = None) -> list[Workaround]:
        """The workarounds that applied (by ``by`` alone, if given), in apply order."""
        return [w for name, w in self.instances.items()
                if name in self.applied_by and by in (None, self.applied_by[name])]

    def apply(self, name: str, model: nn.Module, by: str) -> Decision:
        """Apply workaround ``name`` to ``model`` if its gate held and nobody applied it yet."""
        self.decide(model)
        w = self.instances[name]
        if name in self.applied_by:
            reason: str | None = f"already applied by converter {self.applied_by[name]!r}"
            return Decision(name, by, False, reason)
        reason = self.ctx.job_decisions[name]
        if reason is not None:
            # A skipped fix has no effects to describe: only what runs instead.
            return Decision(name, by, False, reason, w.skipped_plan(model))
        with self.patches.active():
            w.apply(model)
        self.applied_by[name] = by
        return Decision(name, by, True, "", w.plan(model))

    def close(self) -> None:
        """Put back every attribute the workarounds patched, unless another job holds the same
        patch."""
        self.patches.release()
