"""Two stub workarounds, as a new one would be written: ``stub_codegen`` (a module, no seam:
it acts on compiled code process-wide) and ``stub_seamed`` (a package with a seam per
generation, ``tests/support/stub_seamed/``). :func:`registered` adds what
docs/architecture.md says a new workaround adds outside its own files (its registry entry and
its ``[rocm]`` mode field) for the length of a test; everything else must follow."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch.nn as nn

from titan_rocm import settings
from titan_rocm.workarounds import registry
from titan_rocm.workarounds.base import Workaround

ENTRIES = {
    "stub_codegen": f"{__name__}:StubCodegen",
    "stub_seamed": "tests.support.stub_seamed.workaround:StubSeamed",
}
"""Their registry entries, as they would stand in ``workarounds/registry.py``."""


class StubCodegen(Workaround):
    """Acts on every compiled kernel of the process (a stand-in for a compiler setting)."""

    name = "stub_codegen"
    needs_rocm = False
    codegen = True
    audit_shapes = "compiled"
    not_measured = "not measured: a stub"

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        return f"the stub's compiler setting at level {details.get('level', '?')}"

    def apply(self, model: nn.Module) -> None:
        self.applied = True

    def plan(self, model: nn.Module) -> dict[str, Any]:
        return {"level": 3}


@contextlib.contextmanager
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[settings.RocmSettings]]:
    """The stubs in the registry, in apply order after the shipped ones, and ``RocmSettings``
    with their mode fields; yields that settings class. Undone on exit."""
    for name, target in ENTRIES.items():
        monkeypatch.setitem(registry.WORKAROUNDS, name, target)
    with_stubs = dataclasses.make_dataclass(
        "RocmSettings",
        [(name, settings.Mode, dataclasses.field(default="auto")) for name in ENTRIES],
        bases=(settings.RocmSettings,))
    monkeypatch.setattr(settings, "RocmSettings", with_stubs)
    yield with_stubs
