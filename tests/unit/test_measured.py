"""The costs ``titan-rocm plan`` quotes (titan_rocm/measured.py) are the stored results' own:
each is recomputed from its folder's logs with its benchmark's ``--reanalyse`` code, so a
figure cannot drift from what was measured; and plan picks the one for the decision in force."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any

import pytest

from titan_rocm.measured import FIGURES, Measured, cost_of
from titan_rocm.plan_format import verdict_lines

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def _reanalysed(benchmark: str, folder: str) -> dict[str, Any]:
    module = importlib.import_module(f"benchmarks.{Path(benchmark).stem}")
    return module.reanalyse(REPO / folder)


def _at(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


@pytest.mark.parametrize("key", sorted(FIGURES))
def test_every_figure_is_recomputed_from_its_stored_result(key: str) -> None:
    m = FIGURES[key]
    assert (REPO / m.folder / "summary.json").is_file() and (REPO / m.benchmark).is_file()
    result = _reanalysed(m.benchmark, m.folder)
    value = _at(result, m.figure)
    if m.over:
        value = value / _at(result, m.over)
    assert round(value, 4) == m.ratio, (key, value)


SCOPE = {"workaround": "moe_eager_compile", "applied": True, "reason": "", "converter": "rocm"}


@pytest.mark.parametrize(("scope", "ratio"), [("block", 0.9315), ("moe", 0.9656)])
def test_the_cost_follows_the_scope_in_force_not_a_default(scope: str, ratio: float) -> None:
    figure = cost_of("moe_eager_compile", {"scope": scope}, ["rocm"])
    assert isinstance(figure, Measured) and figure.ratio == ratio
    plan = {"model": {"name": "m", "flavor": "f"}, "platform": {"arch": "gfx942"},
            "titan_rocm_listed": True, "converters": ["rocm"], "other_converters": [],
            "workarounds": [{**SCOPE, "details": {"scope": scope}}]}
    text = "\n".join(verdict_lines(plan))
    assert f"cost: {ratio:g} x stock tokens/s [1]" in text
    assert "[1] deepseek_v3 3.9 B MoE" in text and figure.folder in text


def test_float8_converters_and_the_guard_modes_get_their_own_figures() -> None:
    fp8 = cost_of("moe_eager_compile", {"scope": "moe"}, ["rocm", "quantize.linear.float8"])
    assert fp8 is FIGURES["moe_eager_compile.fp8"] and fp8.ratio == 0.5806
    for check in ("log_steps", "every_step", "every_step_exact"):
        assert cost_of("divergence_guard", {"check": check}, []) is \
            FIGURES[f"divergence_guard.{check}"]
    assert cost_of("precision_casts", {}, []) is None
