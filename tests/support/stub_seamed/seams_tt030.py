"""``stub_seamed``'s seam into the tt030 generation: the 0.2.2 one's marks, its own name."""

from __future__ import annotations

from tests.support.stub_seamed import seams_tt022


class Seam(seams_tt022.Seam):
    """Marks every block of ``model.layers`` as this generation runs it."""

    generation = "tt030"
