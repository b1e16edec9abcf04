"""TorchTitan 0.3.0's paths users type stay, imported and run as README.md and the docs write
them (tests/unit/test_public_paths.py is the 0.2.2 twin and checks every quoted path exists):

- ``from titan_rocm.torchtitan import rocm`` (and ``RocmTrainer``);
- ``--module titan_rocm.torchtitan.configs --config NAME``, for every NAME the pages use;
- ``--override.imports titan_rocm.torchtitan.override.rocm``, which TorchTitan 0.3.0 keys by
  its function's module (``torchtitan/config/override.py``, ``override``: ``key =
  f"{fn.__module__}.{fn.__name__}"``), so ``override.py`` must be that module itself.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ENTRY = "titan_rocm.torchtitan.override.rocm"


def _documented_configs() -> set[str]:
    """The ``--config`` names the pages give ``--module titan_rocm.torchtitan.configs``."""
    pattern = re.compile(r"--module titan_rocm\.torchtitan\.configs(?:\s|\\)+--config[ =](\w+)")
    return {name for page in PAGES for name in pattern.findall(page.read_text(encoding="utf-8"))}


def test_the_0_3_0_names_import() -> None:
    from titan_rocm.adapters import tt030
    from titan_rocm.torchtitan import RocmTrainer, rocm

    assert rocm is tt030.rocm and RocmTrainer is tt030.RocmTrainer


@pytest.mark.parametrize("name", sorted(_documented_configs()))
def test_every_documented_config_parses_as_a_rocm_trainer(name: str) -> None:
    from torchtitan.config import ConfigManager

    from titan_rocm.torchtitan import RocmTrainer

    config = ConfigManager().parse_args(["--module", "titan_rocm.torchtitan.configs",
                                         "--config", name, "--rocm.moe_eager_compile", "off"])
    assert type(config) is RocmTrainer.Config and config.rocm.moe_eager_compile == "off"


def test_the_pages_name_configs() -> None:
    assert {"deepseek_v3_16b", "llama3_8b"} <= _documented_configs()


@pytest.mark.parametrize("module", ["titan_rocm.torchtitan", "titan_rocm.torchtitan.configs",
                                    "titan_rocm.torchtitan.override"])
def test_the_0_3_0_paths_are_files_of_this_checkout(module: str) -> None:
    """Found by path among this checkout's files, not through an editable install of another
    checkout or a module already in ``sys.modules``."""
    parent, _, name = module.rpartition(".")
    where = importlib.import_module(parent).__path__ if parent != "titan_rocm" else [
        str(REPO / "titan_rocm")]
    spec = importlib.machinery.PathFinder.find_spec(name, where)
    assert spec is not None and Path(spec.origin).is_relative_to(REPO), (module, spec)


def test_configs_is_the_adapters_module_itself() -> None:
    configs = importlib.import_module("titan_rocm.torchtitan.configs")
    assert configs is importlib.import_module("titan_rocm.adapters.tt030.configs")


def test_the_override_entry_resolves_to_its_own_module() -> None:
    from torchtitan.config.override import _REGISTRY, _resolve_target

    from titan_rocm.adapters.tt030.job import OVERRIDE_ENTRY

    assert _resolve_target(ENTRY) == ("titan_rocm.torchtitan.override", "rocm")
    module = sys.modules["titan_rocm.torchtitan.override"]
    assert module.__name__ == "titan_rocm.torchtitan.override"  # a module, not a shim
    assert _REGISTRY[ENTRY].factory is module.rocm
    assert _REGISTRY[ENTRY].origin_module == "titan_rocm.torchtitan.override"
    assert module.ENTRY == ENTRY and OVERRIDE_ENTRY == ENTRY  # what plan looks for
