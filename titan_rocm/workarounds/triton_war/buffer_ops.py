"""The AMD buffer-ops knob of the installed Triton: find it, and turn it off for a recompile.

Triton keys its cache on ``os.environ``, so a recompile changes both or hits the old binary."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

from titan_rocm.scanner.names import BUFFER_OPS_ENV
from titan_rocm.workarounds.triton_war.compile_lock import COMPILE_LOCK


@contextlib.contextmanager
def env_set(name: str, value: str, environ: MutableMapping[str, str] | None = None
            ) -> Iterator[None]:
    """Set one environment variable inside the block; put back what was there (or nothing)."""
    env = os.environ if environ is None else environ
    saved = env.get(name)
    env[name] = value
    try:
        yield
    finally:
        if saved is None:
            env.pop(name, None)
        else:
            env[name] = saved


@dataclass(frozen=True)
class BufferOpsKnob:
    """How the installed Triton turns AMD buffer ops off, and what it does by default."""

    triton_version: str
    env_var: str
    """``AMDGCN_USE_BUFFER_OPS``."""
    knob: str | None
    """``triton.knobs.amd.<attr>`` (Triton >= 3.4), None where only the variable exists."""
    default: bool | None
    """Buffer ops on when the variable is unset (None: this Triton does not say)."""
    env_value: str | None
    effective: bool | None
    in_cache_key: bool
    """Must be True, or the recompile would be a cache hit on the hazardous binary."""

    @property
    def attr(self) -> str | None:
        """The knob attribute on ``triton.knobs.amd``."""
        return self.knob.rsplit(".", 1)[1] if self.knob else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _knob_descriptor(amd: Any) -> tuple[str, Any] | None:
    """(attribute, descriptor) of the knob, found by its environment variable so a renamed
    attribute is still found."""
    fallback = None
    for klass in type(amd).__mro__:
        for attr, desc in vars(klass).items():
            if getattr(desc, "key", None) == BUFFER_OPS_ENV:
                return attr, desc
            if attr == "use_buffer_ops" and fallback is None:
                fallback = (attr, desc)
    return fallback


def cache_env_fn() -> Callable[[], dict[str, str]] | None:
    """Triton's "environment variables in the cache key" function, wherever this Triton keeps it."""
    for module_name in ("triton.compiler.compiler", "triton._C.libtriton", "triton.runtime.cache"):
        try:
            fn = getattr(importlib.import_module(module_name), "get_cache_invalidating_env_vars",
                         None)
        except ImportError:
            continue
        if fn is not None:
            return fn
    return None


def buffer_ops_knob() -> BufferOpsKnob:
    """Inspect the installed Triton's buffer-ops knob (imports triton)."""
    import triton

    try:
        from triton import knobs
    except ImportError:  # Triton < 3.4: no knobs module, only the environment variable
        knobs = None
    found = _knob_descriptor(knobs.amd) if knobs is not None and hasattr(knobs, "amd") else None
    env_var, knob, default, effective = BUFFER_OPS_ENV, None, None, None
    if found is not None:
        attr, desc = found
        env_var = getattr(desc, "key", BUFFER_OPS_ENV)
        knob = f"triton.knobs.amd.{attr}"
        default = getattr(desc, "default", None)
        effective = bool(getattr(knobs.amd, attr))
    with COMPILE_LOCK.exclusive():
        in_key = _env_in_cache_key(env_var)
    return BufferOpsKnob(
        triton_version=getattr(triton, "__version__", "unknown"),
        env_var=env_var,
        knob=knob,
        default=default,
        env_value=os.environ.get(env_var),
        effective=effective,
        in_cache_key=in_key,
    )


def _env_in_cache_key(env_var: str) -> bool:
    """Whether Triton's cache key would include the variable (caller holds the lock exclusive)."""
    fn = cache_env_fn()
    if fn is None:
        return False
    with env_set(env_var, "0"):
        return env_var in fn()


@contextlib.contextmanager
def buffer_ops_off(knob: BufferOpsKnob) -> Iterator[None]:
    """Compiles inside see buffer ops off, in the knob and in ``os.environ`` (the cache key); holds
    :data:`COMPILE_LOCK` exclusive because both are process-global."""
    with COMPILE_LOCK.exclusive():
        if knob.attr is None:
            with env_set(knob.env_var, "0"):
                yield
            return
        from triton import knobs

        saved_propagate = knobs.propagate_env
        knobs.propagate_env = True  # setting the knob then also writes os.environ
        try:
            with knobs.amd.scope():
                setattr(knobs.amd, knob.attr, False)
                if os.environ.get(knob.env_var) not in ("0", "false", "False"):
                    raise RuntimeError(
                        f"setting {knob.knob} = False left {knob.env_var}="
                        f"{os.environ.get(knob.env_var)!r}: the cache key would not change"
                    )
                yield
        finally:
            knobs.propagate_env = saved_propagate
