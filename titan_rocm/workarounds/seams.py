"""Where each workaround reaches into one TorchTitan generation's code, picked once per job.

Seams are named by ``"module:Class"`` strings so nothing of a generation the process does not run is
imported; this module imports no workaround, so it stands below them all."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from titan_rocm.torchtitan_version import FOLDED_TOKENS, Installed

TORCHTITAN_022 = "torchtitan 0.2.2"
"""``Context.framework`` of a job built by the 0.2.2 converters."""
TORCHTITAN_030 = "torchtitan 0.3.0"
"""``Context.framework`` of a job built by the 0.3.0 trainer adapter (``titan_rocm.torchtitan``)."""


class SeamUnavailable(RuntimeError):
    """A workaround's seam cannot be used in this job; the message is the skip reason."""


@dataclass(frozen=True)
class Generation:
    """One TorchTitan generation as the workarounds see it: which seam each one uses."""

    framework: str
    """``Context.framework`` of its jobs, e.g. ``torchtitan 0.2.2``."""
    seams: Mapping[str, str] = field(default_factory=dict)
    """Workaround name -> ``"module:Class"`` of its seam; a class takes the Context. Named
    here, a seam wins over :attr:`beside`'s."""
    beside: str | None = None
    """Suffix of the seam modules beside each workaround (``tt022``); None: only :attr:`seams`."""
    moved: Mapping[str, str] = field(default_factory=dict)
    """Workaround name -> why its seam does not fit the installed TorchTitan (a known API
    shape whose seam moved): ``auto`` skips with it, ``on`` fails start-up with it."""
    variants: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Variant of the installed TorchTitan -> workaround name -> ``"module:Class"`` it takes
    instead."""

    def with_moved(self, moved: Mapping[str, str]) -> Generation:
        """This generation with the installed TorchTitan's moved seams added."""
        return dataclasses.replace(self, moved={**self.moved, **moved})

    def for_installed(self, installed: Installed) -> Generation:
        """This generation as the installed TorchTitan needs it (variants' and moved seams)."""
        seams = dict(self.seams)
        for variant in installed.variants:
            seams.update(self.variants.get(variant, {}))
        return dataclasses.replace(self, seams=seams).with_moved(installed.moved)

    def target(self, name: str, package: str | None = None) -> str | None:
        """``"module:Class"`` of workaround ``name``'s seam (None: this generation has none)."""
        if name in self.seams:
            return self.seams[name]
        if self.beside is None or package is None:
            return None
        return f"{package}.seams_{self.beside}:Seam"

    def targets(self, seamed: Mapping[str, str]) -> dict[str, str]:
        """Workaround name -> its seam's ``"module:Class"``, for :func:`.registry.seamed`'s."""
        return {name: target for name, package in seamed.items()
                if (target := self.target(name, package)) is not None}

    def load(self, name: str, ctx: Any, package: str | None = None) -> Any:
        """Workaround ``name``'s seam for this generation, built for ``ctx``.

        Raises SeamUnavailable (never a traceback from inside the seam) when it moved, is not
        written for this generation, or does not load."""
        if name in self.moved:
            return _raise(self.moved[name])
        target = self.target(name, package)
        if target is None:
            return _raise(f"titan-rocm has no {name} seam for {self.framework}")
        module_name, _, class_name = target.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as error:
            return _raise(f"its {self.framework} seam ({target}) does not load: {error}")
        return cls(ctx)


def _raise(reason: str) -> Any:
    raise SeamUnavailable(reason)


TT022 = Generation(TORCHTITAN_022, beside="tt022")
"""TorchTitan 0.2.2: converters over the TOML JobConfig."""
TT030 = Generation(TORCHTITAN_030, beside="tt030", variants={
    FOLDED_TOKENS: {
        "mla_ck_backward": "titan_rocm.workarounds.mla_ck_backward.seams_tt030:FoldedSeam",
    },
})
"""TorchTitan 0.3.0 (and main, whose folded ``(T, N, H)`` tokens take MLA's folded seam)."""

GENERATIONS: dict[str, Generation] = {g.framework: g for g in (TT022, TT030)}
"""The shipped generations by framework name."""


def generation_of(framework: str) -> Generation:
    """The shipped generation of ``framework``; 0.2.2's for any other name (a Context built
    by hand, as tests and ``titan-rocm tune`` do, has always meant 0.2.2's seams)."""
    return GENERATIONS.get(framework, TT022)
