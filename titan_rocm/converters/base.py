"""The converter framework: workarounds with gates, and TorchTitan converters that run them.

A :class:`Workaround` is one fix (precision casts, mixed MoE compile, ...). A
:class:`RocmConverter` is what TorchTitan instantiates for a name in ``[model] converters``;
it runs one or more workarounds. Each workaround decides, once per model, whether it
applies (its gate) and logs ``applied`` or ``skipped: <reason>``. A workaround applied by
one converter (say ``rocm``) is not applied again by another (``rocm.grouped_mm``) listed in
the same job.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch.nn as nn
from torchtitan.tools.logging import logger

from titan_rocm import platform
from titan_rocm.config import RocmSettings, settings_from
from titan_rocm.platform import PlatformFacts

_planning: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "titan_rocm_planning", default=False
)


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """Mark converters run inside the block as a ``titan-rocm plan`` dry run.

    Workarounds still decide and apply to the (meta) model, but skip effects that would
    outlive the process, such as writing files.
    """
    token = _planning.set(True)
    try:
        yield
    finally:
        _planning.reset(token)


# Attribute on the converted model recording which converter applied which workaround.
APPLIED_ATTR = "_titan_rocm_applied"


@dataclass
class Context:
    """What a workaround may look at: the job, the parallel layout, settings, platform."""

    job_config: Any
    parallel_dims: Any
    settings: RocmSettings
    platform: PlatformFacts

    @classmethod
    def from_job(cls, job_config: Any, parallel_dims: Any) -> Context:
        """Build from TorchTitan's arguments; validates ``[rocm]`` (ValueError on bad values)."""
        return cls(job_config, parallel_dims, settings_from(job_config), platform.current())

    @property
    def planning(self) -> bool:
        """True inside ``titan-rocm plan``: skip effects that outlive the process."""
        return _planning.get()

    def mode(self, name: str) -> str:
        """The ``[rocm]`` mode (auto/on/off) of workaround ``name``."""
        return getattr(self.settings, name)

    @property
    def compile_enabled(self) -> bool:
        """TorchTitan will torch.compile the model."""
        compile_config = getattr(self.job_config, "compile", None)
        return bool(
            compile_config is not None
            and compile_config.enable
            and "model" in getattr(compile_config, "components", ["model"])
        )


class Workaround:
    """One fix. Subclasses set :attr:`name` and override the hooks they need."""

    name: ClassVar[str]
    """Short name: converter ``rocm.<name>``, ``[rocm] <name> = auto|on|off``."""
    needs_rocm: ClassVar[bool] = True
    """In ``auto`` mode, skip off ROCm."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @property
    def mode(self) -> str:
        """This workaround's mode from ``[rocm]``."""
        return self.ctx.mode(self.name)

    def require(self) -> None:
        """Called at start-up when the mode is ``on``: raise ValueError if it cannot apply."""

    def check(self, model: nn.Module) -> str | None:
        """Workaround-specific precondition: a reason to skip, or None to apply."""
        return None

    def apply(self, model: nn.Module) -> None:
        """Apply the fix to ``model`` (and the process)."""
        raise NotImplementedError

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        """Runs after every optimizer step when the workaround was applied."""

    def plan(self, model: nn.Module) -> dict[str, Any]:
        """JSON-able details for ``titan-rocm plan`` (after :meth:`apply`, or when skipped)."""
        return {}

    def gate(self, model: nn.Module) -> str | None:
        """Why this workaround does not apply to ``model`` (None: it applies)."""
        if self.mode == "off":
            return f"disabled by [rocm] {self.name} = \"off\""
        if self.mode == "auto" and self.needs_rocm and not self.ctx.platform.is_rocm:
            return "not a ROCm build (torch.version.hip is None)"
        return self.check(model)


@dataclass
class Decision:
    """What a converter did with one workaround, for logs and ``titan-rocm plan``."""

    workaround: str
    converter: str
    applied: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def line(self) -> str:
        """The log line."""
        status = "applied" if self.applied else f"skipped: {self.reason}"
        return f"titan-rocm: rocm.{self.workaround} {status}"


class RocmConverter:
    """A TorchTitan model converter running a fixed list of workarounds."""

    converter_name: ClassVar[str]
    workaround_names: ClassVar[tuple[str, ...]]

    def __init__(self, job_config: Any, parallel_dims: Any) -> None:
        self.ctx = Context.from_job(job_config, parallel_dims)
        self.workarounds = [cls(self.ctx) for cls in self.workaround_classes()]
        for w in self.workarounds:
            if w.mode == "on":
                w.require()
        self.decisions: list[Decision] = []
        self._active: list[Workaround] = []

    @classmethod
    def workaround_classes(cls) -> list[type[Workaround]]:
        """The workaround classes this converter runs, in order (looked up by name)."""
        from titan_rocm.workarounds import workaround_class

        return [workaround_class(name) for name in cls.workaround_names]

    def convert(self, model: nn.Module) -> None:
        """Apply every workaround whose gate holds; log one line per workaround."""
        applied: dict[str, str] = model.__dict__.setdefault(APPLIED_ATTR, {})
        for w in self.workarounds:
            if w.name in applied:
                reason = f"already applied by converter {applied[w.name]!r}"
                decision = Decision(w.name, self.converter_name, False, reason)
            else:
                reason = w.gate(model)
                if reason is None:
                    w.apply(model)
                    applied[w.name] = self.converter_name
                    self._active.append(w)
                decision = Decision(
                    w.name, self.converter_name, reason is None, reason or "", w.plan(model)
                )
            self.decisions.append(decision)
            logger.info(decision.line)

    def post_optimizer_hook(self, model: nn.Module | list[nn.Module]) -> None:
        """Forward TorchTitan's post-optimizer hook to the workarounds this converter applied."""
        parts = model if isinstance(model, list) else [model]
        for w in self._active:
            w.post_optimizer_hook(parts)
