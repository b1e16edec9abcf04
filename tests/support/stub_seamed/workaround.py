"""``stub_seamed``: marks each block through its generation's seam, which says how it runs it.
Registered for a test by :func:`tests.support.stub_workaround.registered`."""

from __future__ import annotations

from typing import Any, Protocol

import torch.nn as nn

from titan_rocm.workarounds.base import Workaround


class StubSeam(Protocol):
    """What the workaround asks of a generation's code."""

    generation: str

    def mark(self, model: nn.Module) -> dict[str, str]:
        """Mark the model's blocks; block key -> how the generation runs it."""
        ...


class StubSeamed(Workaround):
    """Marks the blocks of ``model.layers`` through ``ctx.seam("stub_seamed")``."""

    name = "stub_seamed"
    needs_rocm = False
    has_seam = True
    audit_shapes = "listed"
    seam: StubSeam

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.marked: dict[str, str] = {}

    def apply(self, model: nn.Module) -> None:
        self.marked = self.seam.mark(model)

    def plan(self, model: nn.Module) -> dict[str, Any]:
        return {"generation": self.seam.generation, "blocks": self.marked}

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        return f"blocks marked through the {details.get('generation')} seam"

    def audit_blocks(self, model_parts: list[nn.Module]) -> dict[str, str]:
        return self.marked
