"""Check 5: ``build_model_converters``' names and the quantization converters' first check."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from titan_rocm.adapters.common import StartupError
from titan_rocm.adapters.common import one_line as _one_line
from titan_rocm.adapters.tt022.preflight.launchers import LAUNCH_LINES


def _modules_register_titan_rocm(modules: Sequence[str]) -> bool:
    """Whether a fresh interpreter imports titan_rocm once ``modules`` are (a ``sitecustomize``
    counts too, as in the job)."""
    if any(m.split(".")[0] == "titan_rocm" for m in modules):
        return True
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
            "print('titan_rocm' in sys.modules)")
    try:
        out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True,
                             text=True, timeout=300, check=False, cwd=os.getcwd())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip().endswith("True")


def registered_converters(job_config: Any, launcher: str) -> tuple[str, ...]:
    """The model converter names TorchTitan's registry would hold for this job: titan-rocm's count
    only when the job imports ``titan_rocm``."""
    import torchtitan.train  # noqa: F401 - what the launch imports; registers TorchTitan's
    from torchtitan.protocols.model_converter import _registry_model_converter_cls as registry

    ours = titan_rocm_converters()
    names = [n for n in registry if n not in ours]
    if launcher == "titan-rocm":
        return (*names, *sorted(ours))
    if all(c in names for c in job_config.model.converters):
        return tuple(names)  # whether titan_rocm is imported changes nothing
    modules = [m for m in (job_config.job.custom_config_module,
                           job_config.experimental.custom_import) if m]
    if _modules_register_titan_rocm(modules):
        names += sorted(ours)
    return tuple(names)


def check_converters(job_config: Any, registered: Sequence[str]) -> None:
    """Each ``[model] converters`` name must be registered (StartupError naming the first
    unknown)."""
    known = set(registered)
    ours = titan_rocm_converters()
    for name in job_config.model.converters:
        if name in known:
            continue
        failure = f"TorchTitan 0.2.2 would stop at start-up with KeyError: {name!r}"
        if name in ours:
            raise StartupError(
                f"[model] converters lists {name!r}, titan-rocm's, but the job never imports "
                f"titan_rocm, so {failure}: add custom_import = \"titan_rocm\" under "
                "[experimental] (or --experimental.custom_import titan_rocm), or launch "
                f"with {LAUNCH_LINES['titan-rocm']} (plan --launcher titan-rocm)"
            )
        hint = ""
        if name == "":
            hint = " (an empty name, from --model.converters \"\" or a stray comma)"
        elif name != name.strip():
            hint = (" (--model.converters splits on commas only, so a space stays in the name: "
                    "write rocm,quantize.linear.float8 without spaces)")
        listing = ", ".join(sorted(known)) or "(none)"
        if not ours <= known:
            listing += f"; titan-rocm's, once the job imports titan_rocm: {', '.join(sorted(ours))}"
        raise StartupError(
            f"[model] converters: {name!r} is not a registered model converter{hint}, so "
            f"{failure}; registered: {listing}"
        )


def check_quantization(job_config: Any) -> None:
    """One quantization type per job: the GPU-free part of the check (StartupError)."""
    if not any("quantize" in c for c in job_config.model.converters):
        return
    from torchtitan.components.quantization import QuantizationConverter

    try:
        QuantizationConverter._validate(job_config)
    except AssertionError as exc:
        raise StartupError(f"{_one_line(exc).removeprefix('AssertionError: ')} "
                           "(TorchTitan 0.2.2)") from None


def titan_rocm_converters() -> set[str]:
    """Names of titan-rocm's converters (registered in this process, whatever the job does)."""
    from torchtitan.protocols.model_converter import _registry_model_converter_cls as registry

    from titan_rocm import register_converters

    register_converters()
    return {n for n, c in registry.items() if c.__module__.startswith("titan_rocm")}
