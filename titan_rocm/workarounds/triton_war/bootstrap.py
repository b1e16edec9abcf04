"""Make the Triton compile wrapper active in every process where Triton compiles.

Inductor compiles in subprocesses, where a wrapper installed in the trainer never runs, so
:func:`export` puts titan-rocm's ``sitecustomize.py`` first on their path; nothing is written to
site-packages. Kept cheap: it runs at the start of every child interpreter."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

from titan_rocm import patches
from titan_rocm._after_import import AfterImport
from titan_rocm.scanner.names import (
    ENV_ENABLE,
    ENV_RULE,
    ENV_STATS_DIR,
    ENV_STRICT,
    RULE_NAMES,
    WORKER_ENV,
)
from titan_rocm.settings import DEFAULT_HAZARD_RULE

_TRIGGER = "triton"
BY = "triton_war environment"
"""Who makes the settings :func:`export` makes (:mod:`titan_rocm.patches`)."""


def boot_dir() -> str:
    """The directory holding titan-rocm's ``sitecustomize.py``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")


def settings_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """(rule, strict) from the environment; raises ValueError naming the bad variable."""
    env = os.environ if environ is None else environ
    rule = env.get(ENV_RULE, DEFAULT_HAZARD_RULE)
    if rule not in RULE_NAMES:
        raise ValueError(f"{ENV_RULE}={rule!r} is not valid; accepted: {', '.join(RULE_NAMES)}")
    strict_text = env.get(ENV_STRICT, "0")
    if strict_text not in ("0", "1"):
        raise ValueError(f"{ENV_STRICT}={strict_text!r} is not valid; accepted: 0, 1")
    return rule, strict_text == "1"


def worker_environment(rule: str, strict: bool, stats_dir: str | None) -> dict[str, str]:
    """The variables a child needs to install the wrapper itself (see :func:`export`)."""
    env = {ENV_ENABLE: "1", ENV_RULE: rule, ENV_STRICT: "1" if strict else "0"}
    if stats_dir:
        env[ENV_STATS_DIR] = stats_dir
    settings_from_env(env)  # validate
    return env


def _prepend_path(value: str | None, entry: str) -> str:
    parts = [p for p in (value or "").split(os.pathsep) if p and p != entry]
    return os.pathsep.join([entry, *parts])


def export(
    rule: str,
    strict: bool,
    stats_dir: str | None,
    environ: MutableMapping[str, str] | None = None,
    path: list[str] | None = None,
) -> dict[str, str]:
    """Make every Python this process starts from now on install the wrapper; return the
    variables set (for logs and ``plan``)."""
    env = os.environ if environ is None else environ
    values = worker_environment(rule, strict, stats_dir)
    here = boot_dir()
    # Inductor hands sys.path to its workers as PYTHONPATH.
    if path is None:
        patches.setting(sys, "path", [here, *(p for p in sys.path if p != here)], by=BY)
    else:
        while here in path:
            path.remove(here)
        path.insert(0, here)
    values["PYTHONPATH"] = _prepend_path(env.get("PYTHONPATH"), here)
    if env.get("TORCH_CUSTOM_PYTHONPATH"):
        values["TORCH_CUSTOM_PYTHONPATH"] = _prepend_path(env["TORCH_CUSTOM_PYTHONPATH"], here)
    for key, value in values.items():
        patches.setting(env, key, value, by=BY)
    return values


def unexport(
    environ: MutableMapping[str, str] | None = None, path: list[str] | None = None
) -> None:
    """Undo :func:`export` whoever holds it (tests, and turning the workaround off
    in-process); a job's teardown puts back what it set without this."""
    if environ is None and path is None:
        patches.restore(by=BY)
    env = os.environ if environ is None else environ
    sys_path = sys.path if path is None else path
    for key in WORKER_ENV:
        env.pop(key, None)
    here = boot_dir()
    while here in sys_path:
        sys_path.remove(here)
    for key in ("PYTHONPATH", "TORCH_CUSTOM_PYTHONPATH"):
        if key in env:
            rest = [p for p in env[key].split(os.pathsep) if p and p != here]
            if rest:
                env[key] = os.pathsep.join(rest)
            else:
                del env[key]


def _install_from_env() -> None:
    try:
        rule, strict = settings_from_env()
        from titan_rocm.workarounds.triton_war.compile_hook import install

        install(rule=rule, strict=strict)
    except Exception as e:
        # A worker without the wrapper would compile hazardous kernels unnoticed: say so on
        # its stderr (Inductor's worker log), and refuse to go on when strict.
        print(f"titan-rocm: cannot install the Triton compile wrapper in pid {os.getpid()}: "
              f"{e!r}", file=sys.stderr)
        if os.environ.get(ENV_STRICT) == "1":
            raise


_hook = AfterImport(_TRIGGER, lambda _module: _install_from_env())


def boot() -> None:
    """At interpreter start: with ``TITAN_ROCM_TRITON_WAR=1``, install the wrapper once ``triton``
    is imported."""
    if os.environ.get(ENV_ENABLE) != "1":
        return
    _hook.arm()
