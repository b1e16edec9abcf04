"""Where ``titan_rocm.tuned_gemms.choices`` takes Inductor's ``DictKernelTemplateParams`` from:
``torch._inductor.heuristics.template.params`` first (torch 2.14.1 and 2.15.0, line 24), torch
2.13's ``torch._inductor.template_heuristics.params`` (line 24) where that is missing; 2.14 and
2.15 keep the old path as a re-exporting shim "removed in a future release"."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from titan_rocm.tuned_gemms import choices

REPO = Path(__file__).resolve().parents[3]
NEW = "torch._inductor.heuristics.template.params"
OLD = "torch._inductor.template_heuristics.params"


def _has(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_the_new_path_is_taken_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch with the new path (a stand-in module where this torch has none): its class."""
    new = types.ModuleType(NEW)

    class DictKernelTemplateParams:  # the stand-in: only its identity is checked
        pass

    new.DictKernelTemplateParams = DictKernelTemplateParams
    parts = NEW.split(".")
    for depth in range(3, len(parts)):  # torch 2.13 has no torch._inductor.heuristics
        parent = ".".join(parts[:depth])
        if parent not in sys.modules and not _has(parent):
            monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    monkeypatch.setitem(sys.modules, NEW, new)
    assert choices._template_params_class() is DictKernelTemplateParams


def test_the_old_path_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch without the new path (torch 2.13, or the new module hidden here)."""
    monkeypatch.setitem(sys.modules, NEW, None)  # import raises ModuleNotFoundError
    got = choices._template_params_class()
    assert got is sys.modules[OLD].DictKernelTemplateParams
    assert got.__name__ == "DictKernelTemplateParams"


@pytest.mark.skipif(not _has("torch._inductor.heuristics"),
                    reason="this torch (2.13) has only the old path")
def test_importing_choices_leaves_the_deprecated_shim_alone() -> None:
    """Where the new path exists, importing choices neither loads the old shim nor warns."""
    code = (
        "import json, sys, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import titan_rocm.tuned_gemms.choices as c\n"
        "print(json.dumps({'shim': 'torch._inductor.template_heuristics' in sys.modules,\n"
        "    'module': c.DictKernelTemplateParams.__module__,\n"
        "    'warnings': [str(w.message) for w in caught if 'heuristics' in str(w.message)\n"
        "                 or issubclass(w.category, DeprecationWarning)\n"
        "                 and 'titan_rocm' in w.filename]}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=300, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"shim": False, "module": NEW, "warnings": []}, out
