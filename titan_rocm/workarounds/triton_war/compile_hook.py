"""Wrap Triton's ``compile``: scan each HIP kernel, recompile hazardous ones with buffer ops off
(docs/triton-buffer-store-hazard.md, "How titan-rocm recompiles (wrapper)")."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from titan_rocm import patches
from titan_rocm.log import log
from titan_rocm.scanner.names import BUFFER_OPS_ENV, RULE_NAMES
from titan_rocm.settings import DEFAULT_HAZARD_RULE
from titan_rocm.workarounds.triton_war import stats
from titan_rocm.workarounds.triton_war.buffer_ops import (
    BufferOpsKnob,
    buffer_ops_knob,
    buffer_ops_off,
    cache_env_fn,
)
from titan_rocm.workarounds.triton_war.compile_lock import COMPILE_LOCK

NAME = "triton_war"
_MARK = "__titan_rocm_triton_war__"
# Where Triton and Inductor look ``compile`` up: (module name, attribute).
_BIND_SITES: tuple[tuple[str, str], ...] = (
    ("triton.compiler.compiler", "compile"),
    ("triton.compiler", "compile"),
    ("triton", "compile"),
)

Scanner = Callable[[str, "str | None", str], Any]
"""``scanner(amdgcn_text, arch, rule)`` -> a report with ``.hazardous`` and ``.hazards``."""


class HazardousKernelError(RuntimeError):
    """A kernel keeps the buffer-store data hazard and ``strict`` is set."""


def scan_amdgcn(text: str, arch: str | None, rule: str) -> Any:
    """The default scanner: :func:`titan_rocm.scanner.scan.scan_text`."""
    from titan_rocm.scanner.scan import scan_text

    return scan_text(text, arch=arch, rule=rule)


@dataclass
class HookConfig:
    """What the installed wrapper does (updated in place by a second :func:`install`)."""

    rule: str = DEFAULT_HAZARD_RULE
    strict: bool = False
    scanner: Scanner = scan_amdgcn


class CompileHook:
    """The wrapper around one original ``compile`` function."""

    def __init__(self, original: Callable[..., Any], config: HookConfig) -> None:
        self.original = original
        self.config = config
        self.signature = inspect.signature(original)
        self.accepts_env_vars = "_env_vars" in self.signature.parameters
        self._knob: BufferOpsKnob | None = None
        self.wrapper = self._make_wrapper()

    @property
    def knob(self) -> BufferOpsKnob:
        """The buffer-ops knob, inspected at first use."""
        if self._knob is None:
            self._knob = buffer_ops_knob()
        return self._knob

    def _make_wrapper(self) -> Callable[..., Any]:
        original = self.original

        @functools.wraps(original)
        def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - Triton's name
            with COMPILE_LOCK.shared():
                if self.accepts_env_vars and (len(args) > 3 or "_env_vars" in kwargs):
                    args, kwargs = self._fresh_env_vars(args, kwargs)
                kernel = original(*args, **kwargs)
            return self.check(kernel, args, kwargs)

        setattr(compile, _MARK, self)
        return compile

    def _fresh_env_vars(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Drop ``_env_vars`` computed while another thread had buffer ops off (the JIT's async
        path computes them early): they would key this compile as buffer-ops-off."""
        bound = self.signature.bind_partial(*args, **kwargs)
        given = bound.arguments.get("_env_vars")
        fn = cache_env_fn()
        if given is None or fn is None:
            return args, kwargs
        env_var = BUFFER_OPS_ENV if self._knob is None else self._knob.env_var
        if given.get(env_var) != fn().get(env_var):
            bound.arguments["_env_vars"] = None
            return bound.args, bound.kwargs
        return args, kwargs

    def recompile(self, args: tuple, kwargs: dict) -> Any:
        """Compile the same source again with buffer ops off (cache key included)."""
        bound = self.signature.bind_partial(*args, **kwargs)
        if self.accepts_env_vars:
            bound.arguments["_env_vars"] = None  # recompute from os.environ inside the flip
        knob = self.knob
        with buffer_ops_off(knob):
            return self.original(*bound.args, **bound.kwargs)

    def check(self, kernel: Any, args: tuple, kwargs: dict) -> Any:
        """Scan ``kernel``; return it, or its buffer-ops-off recompile when it is hazardous."""
        config = self.config
        metadata = getattr(kernel, "metadata", None)
        target = getattr(metadata, "target", None)
        name = str(getattr(kernel, "name", None) or getattr(metadata, "name", "?"))
        if getattr(target, "backend", None) != "hip":
            stats.record(stats.SKIPPED_NON_HIP, name)
            return kernel
        arch = getattr(target, "arch", None)
        arch = str(arch) if arch is not None else None
        text = getattr(kernel, "asm", {}).get("amdgcn")
        if not text:
            stats.record(stats.UNSCANNED, name, arch=arch, reason="no amdgcn text")
            log.warning(
                "titan-rocm: Triton kernel %s has no AMDGCN text (TRITON_STORE_BINARY_ONLY?): "
                "not scanned for the buffer-store data hazard", name)
            return kernel
        try:
            report = config.scanner(text, arch, config.rule)
        except Exception as e:  # the scanner must not break compiles; say so loudly
            stats.record(stats.UNSCANNED, name, arch=arch, reason=f"scan failed: {e!r}")
            log.error("titan-rocm: scanning Triton kernel %s failed: %r", name, e)
            if config.strict:
                raise HazardousKernelError(f"scanning Triton kernel {name} failed: {e!r}") from e
            return kernel
        if not report.hazardous:
            stats.record(stats.CLEAN, name, arch=arch)
            return kernel

        first = _describe_hazard(report)
        log.warning(
            "titan-rocm: Triton kernel %s (%s) has %d hazardous buffer store(s) (rule %s; %s); "
            "recompiling it with buffer ops off", name, arch, len(report.hazards),
            getattr(report, "rule", config.rule), first)
        reason = None
        try:
            fixed = self.recompile(args, kwargs)
        except Exception as e:
            reason = f"recompile with buffer ops off failed: {e!r}"
        else:
            if getattr(fixed, "hash", None) == getattr(kernel, "hash", object()):
                reason = (f"recompile returned the same cache entry ({self.knob.env_var} is not "
                          "part of this Triton's cache key)")
            else:
                reason = self._rescan(fixed, arch)
        if reason is None:
            stats.record(stats.PATCHED, name, arch=arch, hazards=len(report.hazards))
            log.info("titan-rocm: Triton kernel %s recompiled with buffer ops off: clean", name)
            return fixed
        stats.record(stats.RESIDUAL, name, arch=arch, reason=reason)
        message = (f"titan-rocm: Triton kernel {name} ({arch}) keeps the buffer-store data "
                   f"hazard: {reason}; first hazard: {first}. Its outputs may be corrupt.")
        log.error(message)
        if config.strict:
            raise HazardousKernelError(message + " ([rocm] triton_war_strict = true)")
        return kernel


    def _rescan(self, fixed: Any, arch: str | None) -> str | None:
        """Why the recompiled kernel cannot be used, or None when it scans clean."""
        text = getattr(fixed, "asm", {}).get("amdgcn")
        if not text:
            return "the recompiled kernel has no AMDGCN text to rescan"
        try:
            again = self.config.scanner(text, arch, self.config.rule)
        except Exception as e:
            return f"rescan of the recompiled kernel failed: {e!r}"
        if again.hazardous:
            return f"still hazardous with buffer ops off ({_describe_hazard(again)})"
        return None


def _describe_hazard(report: Any) -> str:
    hazards = getattr(report, "hazards", None) or []
    if not hazards:
        return "no details"
    h = hazards[0]
    return (f"line {getattr(h, 'line', '?')}: {getattr(h, 'store', '?')!s} overwritten by "
            f"{getattr(h, 'writer', '?')!s} after {getattr(h, 'wait_states', '?')} wait "
            f"state(s), {getattr(h, 'required', '?')} needed")




_install_lock = threading.Lock()
_hook: CompileHook | None = None


def _modules() -> dict[str, Any]:
    import sys

    import triton  # noqa: F401 - loads triton.compiler and triton.compiler.compiler

    return {name: sys.modules[name] for name, _ in _BIND_SITES}


def install(
    *, rule: str = DEFAULT_HAZARD_RULE, strict: bool = False, scanner: Scanner | None = None
) -> CompileHook:
    """Install the wrapper and return the active hook; a second call updates it and rebinds any
    reset site. ValueError for an unknown ``rule``, ImportError without Triton."""
    if rule not in RULE_NAMES:
        raise ValueError(
            f"triton_war rule {rule!r} is not valid; accepted: {', '.join(RULE_NAMES)}"
        )
    global _hook
    with _install_lock:
        modules = _modules()
        current = modules["triton.compiler.compiler"].compile
        if _hook is None:
            existing = getattr(current, _MARK, None)
            if existing is not None:  # installed by an earlier copy of this module
                _hook = existing
            else:
                _hook = CompileHook(current, HookConfig())
        _hook.config.rule = rule
        _hook.config.strict = strict
        _hook.config.scanner = scanner or scan_amdgcn
        hook = _hook
        for module_name, attr in _BIND_SITES:
            module = modules[module_name]
            value = getattr(module, attr, None)
            if value is hook.original or getattr(value, _MARK, None) is not None:
                patches.patch(module, attr, lambda _original: hook.wrapper, by=NAME)
            else:
                log.warning(
                    "titan-rocm: %s.%s is %r, not Triton's compile: left alone, so compiles "
                    "through it are not scanned", module_name, attr, value)
        for fn in _jit_functions(hook.original):
            patches.patch(fn, "compile", lambda _original: hook.wrapper, by=NAME)
        return hook


def _jit_functions(compiled_by: Callable[..., Any]) -> list[Any]:
    """``@triton.jit`` functions whose ``fn.compile`` copy is ``compiled_by``: they copy it at first
    launch, so only later launches would get the wrapper otherwise."""
    import sys

    jit = sys.modules.get("triton.runtime.jit")
    registry = getattr(jit, "_triton_jit_function_registry", None) or {}
    return [fn for fn in list(registry.values()) if vars(fn).get("compile") is compiled_by]


def uninstall() -> None:
    """Restore Triton's own ``compile`` everywhere the wrapper is bound or was copied (tests)."""
    global _hook
    with _install_lock:
        if _hook is None:
            return
        patches.restore(by=NAME)
        for fn in _jit_functions(_hook.wrapper):
            fn.compile = _hook.original
        _hook = None


def installed() -> CompileHook | None:
    """The active hook, or None."""
    return _hook


def bound_sites() -> dict[str, bool]:
    """For each place Triton/Inductor look ``compile`` up: is it the wrapper?"""
    hook = _hook
    out = {}
    for module_name, module in _modules().items():
        out[f"{module_name}.compile"] = hook is not None and module.compile is hook.wrapper
    return out
