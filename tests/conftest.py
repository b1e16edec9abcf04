"""Shared fixtures: the GPU marker, the fake aiter (MLA tests), the two TorchTitan suites.

Two suites share this tree: ``tests/tt030/`` is the TorchTitan 0.3.0 suite (marker
``torchtitan030``), everything else the TorchTitan 0.2.2 suite (marker ``torchtitan022``).
Which TorchTitan is installed is read from its files' API, never by importing it (0.3.0
fixes its device type when first imported). The other suite's test modules are not even
imported: each becomes one test skipped with the reason, so ``pytest -q`` in either
environment says what it left out, and ``-m torchtitan030`` / ``-m torchtitan022`` selects
one suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mla_test_support import clean_mla_state, fake_aiter, fake_aiter_path  # noqa: F401
from titan_rocm import torchtitan_version

TT030_SUITE = Path(__file__).resolve().parent / "tt030"
SUITES = {"0.2": ("torchtitan022", "0.2.2"), "0.3": ("torchtitan030", "0.3.0")}
"""TorchTitan release line -> (its marker, the version its suite is written for)."""
INSTALLED = torchtitan_version.installed()
INSTALLED_SERIES = torchtitan_version.series()
"""The installed TorchTitan's API (its files, not its version string: main says 0.2.2 and has
0.3's API); None when none is installed."""


def suite_of(path: Path) -> str:
    """The TorchTitan release line whose suite the test file ``path`` belongs to."""
    return "0.3" if TT030_SUITE in Path(path).resolve().parents else "0.2"


class OtherSuiteModule(pytest.File):
    """A test module of the suite for the TorchTitan that is not installed: not imported."""

    def collect(self):  # noqa: D102 - pytest protocol
        series = suite_of(self.path)
        marker, version = SUITES[series]
        installed = f"torchtitan {INSTALLED}" if INSTALLED else "no torchtitan"
        item = OtherSuiteItem.from_parent(self, name=self.path.name)
        item.add_marker(getattr(pytest.mark, marker))
        item.add_marker(pytest.mark.skip(
            reason=f"TorchTitan {version} suite; this environment has {installed} "
            "(README: the test command runs each suite in its own venv)"
        ))
        yield item


class OtherSuiteItem(pytest.Item):
    """Stands for a whole module of the other suite; always skipped."""

    def runtest(self) -> None:  # noqa: D102 - never runs (skip marker)
        pytest.skip("other TorchTitan suite")

    def reportinfo(self):  # noqa: D102 - pytest protocol
        return self.path, 0, self.name


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    """Keep the other suite's modules unimported (each imports its own TorchTitan)."""
    if INSTALLED_SERIES is None and suite_of(module_path) == "0.2":
        return None  # nothing installed: let the 0.2.2 suite fail loudly as it always did
    if suite_of(module_path) != INSTALLED_SERIES:
        return OtherSuiteModule.from_parent(parent, path=module_path)
    return None


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its TorchTitan suite; skip GPU-marked tests, with the reason,
    where the machine has no GPU."""
    gpu = _has_gpu()
    for item in items:
        item.add_marker(getattr(pytest.mark, SUITES[suite_of(item.path)][0]))
        if item.get_closest_marker("gpu") is not None and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA or ROCm GPU; none here"))


_FLAVOR_MODELS = ("llama3", "deepseek_v3", "qwen3", "llama4")


@pytest.fixture(autouse=True)
def _registered_flavors_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each 0.2.2 test sees copies of TorchTitan's registered flavor args.

    TorchTitan 0.2.2's ``Trainer.__init__`` calls ``update_from_config`` on the registered
    flavor itself, which on a CPU turns MoE grouped MM off (no SM90): one test that builds a
    trainer in process (the numerics audit's, the fault's) made every later ``plan`` of a
    deepseek_v3 job see ``use_grouped_mm = false`` and skip ``rocm.grouped_mm``.
    """
    if INSTALLED_SERIES != "0.2":
        return
    import copy

    from torchtitan.protocols.train_spec import get_train_spec

    for name in _FLAVOR_MODELS:
        try:
            registry = get_train_spec(name).model_args
        except (ValueError, KeyError, ImportError):
            continue
        for flavor, args in list(registry.items()):
            monkeypatch.setitem(registry, flavor, copy.deepcopy(args))
