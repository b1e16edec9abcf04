"""TorchTitan 0.3.0's seam of the grouped-MM binding: the experts' class (:mod:`.tt030`)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.grouped_mm import tt030


class Seam:
    """:class:`~.workaround.GroupedMMSeam` for TorchTitan 0.3.0."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    @property
    def counts_note(self) -> str:
        """What the step-1 call counts leave out."""
        return ("; calls inside compiled blocks (TorchTitan 0.3.0 compiles MoE blocks whole "
                "here) are not counted" if self.ctx.compile.model else "")

    def check(self, model: nn.Module) -> str | None:
        """Why ``model``'s experts cannot be bound (None: they can)."""
        return tt030.check(model)

    def bind(self, model: nn.Module, backend: str, why: str) -> list[str]:
        """Swap each experts module's class for a binding subclass; mark the blocks of a
        backend that does not trace eager; return the seams used."""
        patched = sorted(set(tt030.bind(model, backend).values()))
        eager = tt030.mark_untraceable_blocks(model, backend) if self.ctx.compile.model else []
        log.info(
            "titan-rocm: MoE grouped MM bound to backend %r (%s) through the experts' "
            "class (%s)%s", backend, why, ", ".join(patched),
            f"; MoE blocks {', '.join(eager)} will run eager" if eager else "",
        )
        return patched

    def layer_backends(self, model: nn.Module) -> dict[str, str]:
        """What each experts module calls."""
        return tt030.layer_backends(model)

    def experts_compile(self, backend: str) -> str:
        """How the bound experts run, for the plan."""
        return ("with their block (torchtitan 0.3.0 compiles whole blocks; a backend that "
                "cannot be traced runs its blocks eager)")
