"""What an audit reports: its result (the ``--json`` object), the error of one that could not
run, and the parts of an audit spread over steps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from titan_rocm.numerics.attribution import Segment
from titan_rocm.numerics.stats import AuditSettings, TensorStats, json_number

SCHEMA = 2
"""Version of :meth:`AuditResult.to_dict`'s layout (keys are only ever added within one)."""


@dataclass(frozen=True)
class Part:
    """What one step of an audit spread over steps replays (``numerics_audit_spread``)."""

    index: int
    """1-based, in the order the steps run them."""
    count: int
    blocks: tuple[str, ...]
    outside: bool

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.index, "of": self.count, "blocks": list(self.blocks),
                "outside": self.outside}


def spread(keys: list[str], steps: int) -> list[Part]:
    """The parts of an audit of the blocks ``keys`` spread over ``steps`` steps.

    Blocks are dealt round-robin, so a model of dense then MoE blocks costs about the same each
    step; the last part holds the outside parts and the loss, whose logits cost about a share."""
    if steps <= 1 or not keys:
        return [Part(1, 1, tuple(keys), True)]
    n = min(steps - 1, len(keys))
    return [*(Part(j + 1, n + 1, tuple(keys[j::n]), False) for j in range(n)),
            Part(n + 1, n + 1, (), True)]


class AuditError(RuntimeError):
    """The audit cannot run (the message is one sentence saying why): exit 2, or a skip."""


@dataclass
class AuditResult:
    """What one audit found; :meth:`to_dict` is the ``--json`` object."""

    world_size: int
    tokens: int
    job_dtype: str
    reference: str
    settings: AuditSettings
    segments: list[Segment]
    tensors: list[TensorStats]
    loss: TensorStats | None
    """None in a part of a spread audit that does not compare it."""
    loss_values: dict[str, float]
    """Job, eager, reference; empty where not compared."""
    time_s: dict[str, float]
    peak_memory_bytes: int | None
    memory: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    chunks: int = 1
    outside_chunks: int = 1
    applied: list[str] = field(default_factory=list)
    part: Part | None = None
    """None: the whole audit."""

    @property
    def flagged(self) -> bool:
        return (self.loss is not None and self.loss.flagged) or any(
            t.flagged for t in self.tensors)

    def first_wrong(self, direction: str) -> Segment | None:
        """Forward: in forward order; backward: in backward order (the head first)."""
        order = self.segments if direction == "forward" else list(reversed(self.segments))
        wrong = {t.segment for t in self.tensors if t.flagged and t.direction == direction}
        return next((s for s in order if s.name in wrong), None)

    def first_wrong_module(self, direction: str) -> str | None:
        """The first wrong segment's first wrong child in ``direction``'s order (None: no
        child of it was flagged, or it has none compared)."""
        seg = self.first_wrong(direction)
        if seg is None:
            return None
        mine = [t for t in self.tensors if t.segment == seg.name and t.module is not None]
        order = list(dict.fromkeys(t.module for t in mine))
        if direction == "backward":
            order.reverse()
        wrong = {t.module for t in mine if t.flagged and t.direction == direction}
        first = next((m for m in order if m in wrong), None)
        # A child probed inside the first (moe.router in moe) names the fault more closely.
        return next((m for m in order if m in wrong and first is not None
                     and m.startswith(f"{first}.")), first)

    def segment_rows(self) -> list[dict[str, Any]]:
        """Per segment: its facts, and per direction whether wrong, its worst score, flagged
        tensors."""
        rows = []
        for s in self.segments:
            row = s.to_dict()
            for direction in ("forward", "backward"):
                mine = [t for t in self.tensors if t.segment == s.name
                        and t.direction == direction]
                scores = [t.score for t in mine if not math.isnan(t.score)]
                row[direction] = {"flagged": [t.name for t in mine if t.flagged],
                                  "worst_score": json_number(max(scores)) if scores else 0.0,
                                  "tensors": len(mine)}
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object, with an ``exit_code`` of 0 (ok) or 1 (flagged)."""
        flagged = self.flagged
        first = {d: (s.name if (s := self.first_wrong(d)) else None)
                 for d in ("forward", "backward")}
        return {
            "schema": SCHEMA, "command": "audit", "verdict": "flagged" if flagged else "ok",
            "exit_code": 1 if flagged else 0, "error": None,
            "world_size": self.world_size, "tokens": self.tokens,
            "job_dtype": self.job_dtype, "reference": self.reference,
            "settings": self.settings.to_dict(), "first_wrong": first,
            "first_wrong_module": {d: self.first_wrong_module(d) for d in ("forward", "backward")},
            "loss": None if self.loss is None else {
                **self.loss.to_dict(), **{k: json_number(v) for k, v in self.loss_values.items()}},
            "segments": self.segment_rows(),
            "tensors": [t.to_dict() for t in self.tensors],
            "workarounds_applied": self.applied, "time_s": self.time_s,
            "peak_memory_bytes": self.peak_memory_bytes, "memory": self.memory,
            "chunks": self.chunks, "outside_chunks": self.outside_chunks,
            "notes": self.notes, "part": None if self.part is None else self.part.to_dict(),
        }


def error_dict(message: str, world_size: int = 1) -> dict[str, Any]:
    """The ``--json`` object of an audit that could not run (exit 2): every key, empty."""
    return {
        "schema": SCHEMA, "command": "audit", "verdict": "error", "exit_code": 2,
        "error": message, "world_size": world_size, "tokens": 0, "job_dtype": None,
        "reference": None, "settings": {}, "first_wrong": {"forward": None, "backward": None},
        "first_wrong_module": {"forward": None, "backward": None},
        "loss": None, "segments": [], "tensors": [], "workarounds_applied": [], "time_s": {},
        "peak_memory_bytes": None, "memory": {}, "chunks": 0, "outside_chunks": 0,
        "notes": [], "part": None,
    }
