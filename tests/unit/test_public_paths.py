"""The paths a user types stay: every one README.md and docs/ write is imported or run here.

- Each ``titan_rocm.<dotted>`` path the pages quote names a module of the package, or a name
  one defines (read from the source, nothing imported: the 0.3.0 paths are checked on 0.2.2
  too), so moving or deleting a module the docs send users to fails here.
- The paths users type on TorchTitan 0.2.2 are imported and run: ``import titan_rocm``
  (``custom_import = "titan_rocm"``) registers the converter ``rocm`` and every
  ``rocm.<name>`` docs/converters.md lists, ``custom_config_module = "titan_rocm.config"``
  parses ``--rocm.*``, the console scripts ``titan-rocm`` and ``titan-rocm-train`` and
  ``python -m titan_rocm.cli`` run.
- ``titan_rocm.torchtitan`` and its modules are TorchTitan 0.3.0's: here they refuse with the
  version sentence; tests/tt030/test_tt030_public_paths.py imports and runs them on 0.3.0.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOTTED = re.compile(r"(?<![\w/.-])titan_rocm(?:\.[A-Za-z_]\w*)+")

PUBLIC: dict[str, tuple[str, ...]] = {
    "titan_rocm": ("register_converters", "__version__"),  # custom_import = "titan_rocm"
    "titan_rocm.config": ("JobConfig",),  # custom_config_module = "titan_rocm.config"
    "titan_rocm.train": ("main",),  # python -m titan_rocm.train, titan-rocm-train
    "titan_rocm.cli": ("main", "console_main"),  # python -m titan_rocm.cli, titan-rocm
    "titan_rocm.assets": ("TOKENIZER_DIR", "DATASET_DIR"),  # docs/configs.md
    "titan_rocm.workarounds.grouped_mm": ("register_backend", "call_counts"),  # grouped-mm.md
    "titan_rocm.scanner.scan": ("scan_text", "scan_path"),  # triton-buffer-store-hazard.md
}
"""The 0.2.2 paths users type, with the names the pages use from each."""

TT030_PATHS = ("titan_rocm.torchtitan", "titan_rocm.torchtitan.configs",
               "titan_rocm.torchtitan.override")
"""TorchTitan 0.3.0's paths (``from titan_rocm.torchtitan import rocm``, ``--module``,
``--override.imports``)."""


def _quoted() -> dict[str, list[str]]:
    """Every dotted ``titan_rocm`` path the pages quote -> the pages quoting it."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for path in DOTTED.findall(page.read_text(encoding="utf-8")):
            found.setdefault(path, []).append(page.name)
    return found


QUOTED = _quoted()


def _source(dotted: str) -> Path | None:
    base = REPO.joinpath(*dotted.split("."))
    return next((s for s in (base.with_suffix(".py"), base / "__init__.py") if s.is_file()),
                None)


@cache
def _names(source: Path) -> frozenset[str] | None:
    """The top-level names ``source`` defines, with those of a module it stands for (a
    path users type that is ``importlib.import_module(X)`` made ``sys.modules[__name__]`` or
    copied into ``globals()``); None: any name (a module ``__getattr__``)."""
    names: set[str] = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            call = node.value
            if (isinstance(call, ast.Call) and ast.unparse(call.func) == "importlib.import_module"
                    and call.args and isinstance(call.args[0], ast.Constant)):
                target = _source(call.args[0].value)
                more = _names(target) if target is not None else frozenset()
                if more is None:
                    return None
                names.update(more)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return None if "__getattr__" in names else frozenset(names)


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module or package of the repository, or a name the longest
    such module prefix of it defines (a submodule, for a package)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        source = _source(".".join(parts[:i]))
        if source is None:
            continue
        if i == len(parts):
            return True
        names = _names(source)
        return names is None or parts[i] in names or _source(".".join(parts[:i + 1])) is not None
    return False


def test_the_pages_quote_the_paths_users_type() -> None:
    """The scan reads what it should: the documented entry points are among the quotes."""
    assert {"titan_rocm.config", "titan_rocm.train", "titan_rocm.cli",
            "titan_rocm.torchtitan.configs", "titan_rocm.torchtitan.override.rocm"} <= set(QUOTED)
    assert not resolves("titan_rocm.torchtitan.job") and not resolves("titan_rocm.nowhere")
    assert not resolves("titan_rocm.settings.NO_SUCH_NAME")
    assert resolves("titan_rocm.settings.RocmSettings") and resolves("titan_rocm.adapters.tt022")
    assert resolves("titan_rocm.config.RocmSettings")  # through the shim, to its module
    assert not resolves("titan_rocm.config.NO_SUCH_NAME")


@pytest.mark.parametrize("dotted", sorted(QUOTED))
def test_every_path_the_pages_quote_exists(dotted: str) -> None:
    assert resolves(dotted), f"{dotted} (quoted in {', '.join(QUOTED[dotted])}) is gone"


def in_this_checkout(module: str) -> bool:
    """Whether ``module`` is a file of this checkout, found by path alone: an editable install
    of another checkout (a meta-path finder) or a shim already in ``sys.modules`` would
    otherwise answer for a module deleted here."""
    parent, _, name = module.rpartition(".")
    where = importlib.import_module(parent).__path__ if parent else [str(REPO)]
    spec = importlib.machinery.PathFinder.find_spec(name, where)
    return spec is not None and spec.origin is not None and Path(spec.origin).is_relative_to(REPO)


@pytest.mark.parametrize(("module", "names"), sorted(PUBLIC.items()))
def test_the_paths_users_type_import(module: str, names: tuple[str, ...]) -> None:
    imported = importlib.import_module(module)
    assert in_this_checkout(module), f"{module} is not a file of {REPO}"
    missing = [n for n in names if not hasattr(imported, n)]
    assert missing == [], f"{module} lacks {missing}"


@pytest.mark.parametrize("module", TT030_PATHS)
def test_the_0_3_0_paths_refuse_with_the_version_sentence_on_0_2_2(module: str) -> None:
    from titan_rocm.torchtitan_version import TorchTitanVersionError

    with pytest.raises(TorchTitanVersionError, match=r"^titan_rocm\.torchtitan \(the TorchTitan "
                                                     r"0\.3\.0 adapter\) is for TorchTitan 0\.3"):
        importlib.import_module(module)


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _documented_converters() -> set[str]:
    table = (REPO / "docs" / "converters.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(rocm(?:\.[a-z_]+)?)` \|", table, re.M))


@pytest.mark.slow
def test_custom_import_registers_every_documented_converter_and_the_config_module_parses(
) -> None:
    """``custom_import = "titan_rocm"``: importing the package is what registers ``rocm`` and
    ``rocm.<name>`` once TorchTitan loads (a fresh interpreter, as a job's); and
    ``custom_config_module = "titan_rocm.config"`` makes ``--rocm.*`` parse."""
    documented = _documented_converters()
    assert {"rocm.precision_casts", "rocm.divergence_guard"} <= documented
    script = (
        "import json, titan_rocm\n"
        "from torchtitan.config import ConfigManager\n"
        "from torchtitan.protocols.model_converter import _registry_model_converter_cls as r\n"
        "c = ConfigManager().parse_args(['--job.custom_config_module', 'titan_rocm.config', "
        "'--rocm.triton_war', 'off'])\n"
        "print(json.dumps({'converters': sorted(r), 'triton_war': c.rocm.triton_war}))\n")
    done = _run("-c", script)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["triton_war"] == "off"
    assert {"rocm", *documented} <= set(out["converters"]), out["converters"]


SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def _script(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as its installed wrapper does: pyproject.toml's entry point, called."""
    module, _, function = SCRIPTS[script].partition(":")
    return _run("-c", f"import sys; from {module} import {function}; "
                f"sys.argv = {[script, *argv]!r}; sys.exit({function}())")


def test_the_console_scripts_are_the_documented_ones() -> None:
    assert SCRIPTS == {"titan-rocm": "titan_rocm.cli:console_main",
                       "titan-rocm-train": "titan_rocm.train:main"}


def test_titan_rocm_and_python_m_titan_rocm_cli_run() -> None:
    from titan_rocm import __version__

    for done in (_script("titan-rocm", "--version"), _run("-m", "titan_rocm.cli", "--version")):
        assert done.returncode == 0 and done.stdout == f"titan-rocm {__version__}\n", done


@pytest.mark.slow
def test_titan_rocm_train_runs() -> None:
    """``titan-rocm-train`` (``python -m titan_rocm.train``: tests/tt022/test_train_launcher.py)
    reaches TorchTitan's parser with the ``--rocm.*`` flags."""
    done = _script("titan-rocm-train", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--rocm.triton" in done.stdout and "--model.converters" in done.stdout
