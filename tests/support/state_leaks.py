"""Process-wide state a test leaves behind (``pytest --state-leaks``, tests/conftest.py).

A test that changes torch's or Dynamo's global settings, or the environment, and does not put
them back makes every later test in the process run under them: such a test passes alone and
fails after another (the order dependence ``scripts/random_order.sh`` hunts). Under
``--state-leaks`` the fingerprint below is taken before and after each test (its fixtures'
teardown included) and every difference is reported at the end, by test.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any

Fingerprint = dict[str, str]

UNWATCHED_ENV = frozenset({"PYTEST_CURRENT_TEST", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"})
"""Variables that change by design: pytest's own, and the address Inductor's compiled code
keeps of a Python object (set at each compile)."""


def _attr(owner: Any, name: str) -> str:
    return repr(getattr(owner, name, "<absent>"))


def _configs() -> Fingerprint:
    """Dynamo's, Inductor's, functorch's and torch.compiler's settings (loaded ones only)."""
    import sys

    out: Fingerprint = {}
    for module_name in ("torch._dynamo.config", "torch._inductor.config",
                        "torch._functorch.config", "torch.compiler.config"):
        module = sys.modules.get(module_name)
        if module is None or not hasattr(module, "get_config_copy"):
            continue
        for key, value in module.get_config_copy().items():
            if isinstance(value, (set, frozenset)):  # a set's repr has no fixed order
                value = sorted(value, key=repr)
            # Assigning a setting its default still marks it user-set, which Inductor's and
            # titan-rocm's "did the user set this?" questions read: the mark is state too.
            user_set = "" if module._is_default(key) else " (user-set)"
            out[f"{module_name}.{key}"] = repr(value) + user_set
    return out


TORCHTITAN_MOE_MODULES = ("torchtitan.models.moe.moe",)
"""Modules whose functions TorchTitan 0.2.2's ``apply_compile`` replaces for the whole process
(``moe_module._run_experts_grouped_mm = torch.compile(...)``, llama4/infra/parallelize.py): a
later test's "eager" experts would run compiled code."""


def torchtitan_functions() -> dict[str, dict[str, Any]]:
    """The callables of :data:`TORCHTITAN_MOE_MODULES` now, by module (imported here: the other
    TorchTitan generation has none)."""
    import importlib

    found = {}
    for name in TORCHTITAN_MOE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found[name] = {k: v for k, v in vars(module).items() if callable(v)}
    return found


def fingerprint() -> Fingerprint:
    """The settings a test could leave changed that change how later tests compute, and the
    titan-rocm patches still installed (each workaround's, put back when its job closes)."""
    import torch

    state: Fingerprint = {
        "torch.get_default_dtype()": repr(torch.get_default_dtype()),
        "torch.get_num_threads()": repr(torch.get_num_threads()),
        "torch.are_deterministic_algorithms_enabled()":
            repr(torch.are_deterministic_algorithms_enabled()),
        "torch.get_float32_matmul_precision()": repr(torch.get_float32_matmul_precision()),
        "torch.is_grad_enabled()": repr(torch.is_grad_enabled()),
        "torch.is_anomaly_enabled()": repr(torch.is_anomaly_enabled()),
        "torch.is_autocast_enabled('cpu')": repr(torch.is_autocast_enabled("cpu")),
        "torch.distributed.is_initialized()": repr(
            torch.distributed.is_available() and torch.distributed.is_initialized()),
        "torch.utils.deterministic.fill_uninitialized_memory":
            _attr(torch.utils.deterministic, "fill_uninitialized_memory"),
        "torch.backends.fp32_precision": _attr(torch.backends, "fp32_precision"),
        "torch.backends.cuda.matmul.allow_tf32": _attr(torch.backends.cuda.matmul, "allow_tf32"),
        "torch.backends.cuda.matmul.fp32_precision":
            _attr(torch.backends.cuda.matmul, "fp32_precision"),
        "torch.backends.cudnn.allow_tf32": _attr(torch.backends.cudnn, "allow_tf32"),
        "torch.backends.cudnn.deterministic": _attr(torch.backends.cudnn, "deterministic"),
        "torch.backends.mkldnn.enabled": _attr(torch.backends.mkldnn, "enabled"),
    }
    mkldnn_matmul = getattr(torch.backends.mkldnn, "matmul", None)
    if mkldnn_matmul is not None:
        state["torch.backends.mkldnn.matmul.fp32_precision"] = _attr(mkldnn_matmul,
                                                                     "fp32_precision")
    from titan_rocm import patches

    state["titan_rocm.patches.installed()"] = repr(sorted(
        f"{p.where} by {p.by}" for p in patches.installed()))  # a workaround's, never put back
    state.update(_configs())
    for module_name, functions in torchtitan_functions().items():
        for key, value in sorted(functions.items()):
            if not isinstance(value, type):
                state[f"{module_name}.{key}"] = f"{getattr(value, '__qualname__', '?')} " \
                                                 f"at {id(value):#x}"
    state.update({f"os.environ[{k!r}]": repr(v) for k, v in os.environ.items()
                  if k not in UNWATCHED_ENV})
    return state


def differences(before: Fingerprint, after: Fingerprint) -> list[str]:
    """One ``name: before -> after`` line per setting that changed, or environment variable
    that changed, appeared or went (a config module first loaded during the test is not a
    change: its settings are its defaults)."""
    keys = set(before) | {k for k in after if k.startswith("os.environ")}
    return [f"{key}: {before.get(key, '<unset>')} -> {after.get(key, '<unset>')}"
            for key in sorted(keys) if before.get(key) != after.get(key)]


@contextlib.contextmanager
def never_set(config: Any, names: Iterable[str]) -> Iterator[None]:
    """``names`` of a torch config module as a user who never set them has them (an earlier
    test in the process may have assigned one, even its default, which torch marks as set);
    their marks put back after."""
    from torch.utils._config_module import _UNSET_SENTINEL

    entries = [config._config[name] for name in names]
    saved = [entry.user_override.get() for entry in entries]
    for entry in entries:
        entry.user_override.set(_UNSET_SENTINEL)
    try:
        yield
    finally:
        for entry, value in zip(entries, saved, strict=True):
            entry.user_override.set(value)
