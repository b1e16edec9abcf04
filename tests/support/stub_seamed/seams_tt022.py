"""``stub_seamed``'s seam into the tt022 generation."""

from __future__ import annotations

from typing import Any

import torch.nn as nn


class Seam:
    """Marks every block of ``model.layers`` as this generation runs it."""

    generation = "tt022"

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def mark(self, model: nn.Module) -> dict[str, str]:
        return {key: f"marked by {self.generation}" for key, _ in model.layers.named_children()}
