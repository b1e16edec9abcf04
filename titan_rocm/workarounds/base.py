"""The job's :class:`Context`, :class:`Workaround` and the gating vocabulary (docs/architecture.md).

A workaround never reads a TorchTitan config: each adapter builds a version-neutral Context."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch.nn as nn

from titan_rocm import platform
from titan_rocm.platform import PlatformFacts
from titan_rocm.settings import RocmSettings
from titan_rocm.workarounds.seams import (  # noqa: F401 - TORCHTITAN_*: their names here
    TORCHTITAN_022,
    TORCHTITAN_030,
    Generation,
    SeamUnavailable,
    generation_of,
)

_planning: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "titan_rocm_planning", default=False
)
_plan_teardowns: contextvars.ContextVar[list[Callable[[], None]] | None] = \
    contextvars.ContextVar("titan_rocm_plan_teardowns", default=None)


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """A ``titan-rocm plan`` dry run: no effects outlive the process, and every job made inside
    is closed at the block's end (no patch left behind).
    """
    token = _planning.set(True)
    teardowns: list[Callable[[], None]] = []
    held = _plan_teardowns.set(teardowns)
    try:
        yield
    finally:
        _plan_teardowns.reset(held)
        _planning.reset(token)
        for teardown in reversed(teardowns):
            teardown()


def close_after_plan(teardown: Callable[[], None]) -> None:
    """Run ``teardown`` when the current :func:`planning` block ends (nothing outside one)."""
    teardowns = _plan_teardowns.get()
    if teardowns is not None:
        teardowns.append(teardown)


@dataclass(frozen=True)
class CompileSettings:
    """How the trainer compiles (TorchTitan's ``[compile]``)."""

    enable: bool = False
    backend: str = "inductor"
    components: tuple[str, ...] = ("model", "loss")

    @property
    def model(self) -> bool:
        """The trainer will ``torch.compile`` the model (not only the loss)."""
        return self.enable and "model" in self.components


@dataclass(frozen=True)
class Parallelism:
    """The job's parallel degrees, resolved for its world size (TorchTitan's ``ParallelDims``)."""

    world_size: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1

    @classmethod
    def of(cls, parallel_dims: Any) -> Parallelism:
        """Read TorchTitan's ``ParallelDims`` (any version); None is a single rank."""
        if parallel_dims is None:
            return cls()
        return cls(**{f.name: int(getattr(parallel_dims, f.name, 1)) for f in fields(cls)})

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters are sharded (FSDP over dp_shard, or CP, which shards with it)."""
        return self.dp_shard > 1 or self.cp > 1

    @property
    def cp_enabled(self) -> bool:
        """Context parallelism."""
        return self.cp > 1

    @property
    def tp_enabled(self) -> bool:
        """Tensor parallelism."""
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        """Pipeline parallelism."""
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        """Expert parallelism."""
        return self.ep > 1


def _current_platform() -> PlatformFacts:
    return platform.current()


@dataclass
class Context:
    """What a workaround may know about the job: version-neutral, built by an adapter."""

    settings: RocmSettings = field(default_factory=RocmSettings)
    platform: PlatformFacts = field(default_factory=_current_platform)
    model_name: str | None = None
    flavor: str | None = None
    compile: CompileSettings = field(default_factory=CompileSettings)
    parallel: Parallelism = field(default_factory=Parallelism)
    training_dtype: str = "float32"
    """``[training] dtype``: the dtype parameters are created in."""
    mixed_precision_param: str = "bfloat16"
    """The dtype FSDP (or autocast) computes in when ``training_dtype`` is float32."""
    deterministic: bool = False
    converters: tuple[str, ...] = ()
    """Every model converter the job lists, titan-rocm's and others (by TorchTitan's names)."""
    parallelize_fn: Callable[..., Any] | None = None
    """The function that parallelizes (and compiles) this model, where the framework has one."""
    framework: str = "none"
    """Which TorchTitan adapter built this context, e.g. ``torchtitan 0.2.2``."""
    generation: Generation | None = None
    """Which seam each workaround uses; default: ``framework``'s (0.2.2's for a hand-built Context).
    """
    job_decisions: dict[str, str | None] = field(default_factory=dict)
    """Each workaround's skip reason (None: it applies), filled once before any applies."""
    job: Any = None
    """The job's :class:`~titan_rocm.workarounds.job.JobWorkarounds`, for the audit's attribution.
    """

    def __post_init__(self) -> None:
        if self.generation is None:
            self.generation = generation_of(self.framework)
        self._seams: dict[str, Any] = {}

    def seam(self, name: str, package: str | None = None) -> Any:
        """Workaround ``name``'s seam into this job's TorchTitan, built once per job.

        Raises SeamUnavailable with the sentence why it cannot be used."""
        if name not in self._seams:
            assert self.generation is not None  # __post_init__
            try:
                self._seams[name] = self.generation.load(name, self, package)
            except SeamUnavailable as error:
                self._seams[name] = error
        seam = self._seams[name]
        if isinstance(seam, SeamUnavailable):
            raise seam
        return seam

    @property
    def planning(self) -> bool:
        """True inside ``titan-rocm plan``: skip effects that outlive the process."""
        return _planning.get()

    def mode(self, name: str) -> str:
        """The ``[rocm]`` mode (auto/on/off) of workaround ``name``."""
        return getattr(self.settings, name)

    def will_apply(self, name: str) -> bool:
        """Workaround ``name`` runs in this job and its gate holds (False before decisions)."""
        return name in self.job_decisions and self.job_decisions[name] is None


class RunStopped(RuntimeError):
    """A workaround's results failed validation: every rank stops with
    :data:`titan_rocm.exit_codes.FAILED_VALIDATION` (:mod:`titan_rocm.adapters.stop`)."""

    logged = False
    """This rank's log already holds the message (the guard's rank 0 logs a longer one)."""


class TrainerSeam:
    """Trainer-adapter calls into an applied workaround (0.3.0 only; no-ops here), so a step-level
    workaround needs no patch of TorchTitan's classes."""

    def attach(self, trainer: Any) -> None:
        """The trainer is built (model, loss, optimizers, checkpointer, metrics)."""

    def before_step(self, step: int) -> None:
        """Step ``step`` starts (``train_step``), before any micro-batch."""

    def forward_backward(self, run: Callable[[], Any], input_dict: Any, labels: Any,
                         global_valid_tokens: Any) -> Any:
        """Run one ``forward_backward_step`` (``run``) and return its loss; a seam may act around
        it."""
        return run()

    def after_forward_backward(self, loss: Any, labels: Any, global_valid_tokens: Any) -> None:
        """One ``forward_backward_step`` returned ``loss`` (its backward has run)."""

    def after_optimizer_step(self, trainer: Any) -> None:
        """The optimizer stepped (gradients were clipped); the step's metrics are not read yet."""

    def step_failed(self, error: BaseException, step: int) -> None:
        """``train_step`` raised ``error``: raise a clearer one instead, or return to let it go."""

    def close(self) -> None:
        """The trainer closes after a normal end of training."""


class Workaround:
    """One fix. Subclasses set :attr:`name` and override the hooks they need."""

    trainer_seam: TrainerSeam | None = None
    """Set by :meth:`apply` where the framework's trainer adapter must call back (0.3.0)."""

    name: ClassVar[str]
    """Short name: converter ``rocm.<name>``, ``[rocm] <name> = auto|on|off``."""
    needs_rocm: ClassVar[bool] = True
    """In ``auto`` mode, skip off ROCm."""
    has_seam: ClassVar[bool] = False
    """It reaches into TorchTitan's code through ``ctx.seam(name)`` (:mod:`.seams`)."""
    codegen: ClassVar[bool] = False
    """Changes codegen process-wide from the settings alone: ``titan-rocm tune``'s workers apply
    it too."""
    audit_shapes: ClassVar[str | None] = None
    """Blocks the numerics audit names it on: ``compiled``, ``listed``, ``moe``, ``every``, or None.
    """
    not_measured: ClassVar[str | None] = None
    """Why ``titan-rocm plan`` quotes no measured cost for it; None: it quotes its figure in
    :mod:`titan_rocm.measured`, or the figure of every workaround forced on together."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._unmet: tuple[str | None] | None = None

    @property
    def mode(self) -> str:
        """This workaround's mode from ``[rocm]``."""
        return self.ctx.mode(self.name)

    @classmethod
    def seam_package(cls) -> str:
        """The package its ``seams_tt022.py``/``seams_tt030.py`` sit in."""
        return cls.__module__.rpartition(".")[0]

    @property
    def seam(self) -> Any:
        """This job's seam of this workaround (only where :meth:`seam_problem` is None)."""
        return self.ctx.seam(self.name, self.seam_package())

    def seam_problem(self) -> str | None:
        """Why this workaround's seam cannot be used in this job (None: it can, or it has none)."""
        if not self.has_seam:
            return None
        try:
            self.ctx.seam(self.name, self.seam_package())
        except SeamUnavailable as error:
            return str(error)
        return None

    def unmet(self) -> str | None:
        """What the machine or job lacks for this fix, as one sentence (None: nothing); called once.
        """
        return None

    def check(self, model: nn.Module) -> str | None:
        """Why this fix does not fit ``model`` (None: it does)."""
        return None

    def apply(self, model: nn.Module) -> None:
        """Apply the fix to ``model`` (and the process)."""
        raise NotImplementedError

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        """Runs after every optimizer step when the workaround was applied."""

    def plan(self, model: nn.Module) -> dict[str, Any]:
        """JSON-able details of what the fix does, for ``titan-rocm plan`` (after :meth:`apply`)."""
        return {}

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        """Its line in ``titan-rocm plan``'s verdict, from the details :meth:`plan` returned."""
        return "applied"

    def audit_blocks(self, model_parts: list[nn.Module]) -> dict[str, str]:
        """Block key -> how it runs that block, for ``audit_shapes = "listed"``."""
        return {}

    def audit_note(self) -> str | None:
        """One sentence on what the fix did in this process, for the audit's notes (None: nothing).
        """
        return None

    def skipped_plan(self, model: nn.Module) -> dict[str, Any]:
        """JSON-able facts worth showing when the fix does not apply (never its would-be effects).
        """
        return {}

    def unmet_reason(self) -> str | None:
        """:meth:`seam_problem`, else :meth:`unmet`, asked once."""
        if self._unmet is None:
            self._unmet = (self.seam_problem() or self.unmet(),)
        return self._unmet[0]

    def require(self) -> None:
        """Under ``on``, raise ValueError when :meth:`unmet` names something missing."""
        if self.mode == "on":
            missing = self.unmet_reason()
            if missing:
                raise ValueError(f'[rocm] {self.name} = "on" cannot apply: {missing}')

    def gate(self, model: nn.Module) -> str | None:
        """Why this workaround does not apply to ``model`` (None: it applies)."""
        if self.mode == "off":
            return f"disabled by [rocm] {self.name} = \"off\""
        if self.mode == "auto" and self.needs_rocm and not self.ctx.platform.is_rocm:
            return "not a ROCm build (torch.version.hip is None)"
        # A seam that cannot be used answers first: check() asks the seam about the model.
        return self.seam_problem() or self.check(model) or self.unmet_reason()

