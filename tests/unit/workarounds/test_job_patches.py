"""A job holds what its workarounds patch (titan_rocm.patches) and puts it back when it closes;
a patch two jobs share stays until the second one closes. The patched attributes are read from
their owner, not from the registry."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.nn as nn

import tests.support.stub_generation as stub
from titan_rocm import patches
from titan_rocm.platform import PlatformFacts
from titan_rocm.settings import RocmSettings
from titan_rocm.workarounds.base import Workaround
from titan_rocm.workarounds.job import JobWorkarounds

ROCM = PlatformFacts.simulated_rocm("gfx942")
LIBRARY = types.ModuleType("fake_library")


def _stock(x: int) -> int:
    return x


class _Method:
    def step(self) -> int:
        return 1


def _plus_one(original: Callable[..., int]) -> Callable[..., int]:
    return lambda *args: original(*args) + 1


class Patching(Workaround):
    """Patches a module global and a class's method from ``apply``, as a seam does."""

    name = "precision_casts"  # borrows a real mode field of [rocm]
    needs_rocm = False

    def check(self, model: nn.Module) -> str | None:
        return None

    def apply(self, model: nn.Module) -> None:
        patches.patch(LIBRARY, "compute", _plus_one, by="test job")
        patches.patch(_Method, "step", _plus_one, by="test job")

    def plan(self, model: nn.Module) -> dict[str, Any]:
        return {}


@pytest.fixture(autouse=True)
def _stock_library() -> Iterator[None]:
    LIBRARY.compute = _stock
    yield
    patches.restore(by="test job")


def _job() -> JobWorkarounds:
    ctx = stub.job_context(RocmSettings(precision_casts="on"), ROCM)
    return JobWorkarounds(ctx, ["precision_casts"], {"precision_casts": Patching(ctx)})


def test_a_jobs_close_puts_back_what_its_workarounds_patched() -> None:
    stock_step = vars(_Method)["step"]
    job = _job()
    assert job.apply("precision_casts", nn.Module(), "rocm").applied
    assert LIBRARY.compute(1) == 2 and _Method().step() == 2
    assert [p.to_dict()["held_by"] for p in patches.installed("test job")] == [
        [job.patches.label]] * 2
    job.close()
    assert LIBRARY.__dict__["compute"] is _stock and vars(_Method)["step"] is stock_step
    assert patches.installed("test job") == [] and job.patches.patches == []


def test_a_patch_two_jobs_hold_stays_until_the_last_one_closes() -> None:
    first, second = _job(), _job()
    first.apply("precision_casts", nn.Module(), "rocm")
    second.apply("precision_casts", nn.Module(), "rocm")
    assert LIBRARY.compute(1) == 2  # applied twice, wrapped once
    first.close()
    assert LIBRARY.compute(1) == 2 and _Method().step() == 2
    second.close()
    assert LIBRARY.__dict__["compute"] is _stock and _Method().step() == 1
