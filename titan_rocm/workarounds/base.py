"""The base every workaround stands on: the job's :class:`Context`, :class:`Workaround`,
:class:`Decision`, and the one gating vocabulary.

A workaround is one fix (precision casts, mixed MoE compile, ...). It never reads a
TorchTitan config object: a TorchTitan adapter (``titan_rocm.converters`` for 0.2.2) builds a
version-neutral :class:`Context` from its own job description, and asks each workaround in
turn. The gate means the same everywhere:

- ``on`` **requires**: at start-up, :meth:`Workaround.require` raises ``ValueError`` with the
  sentence :meth:`Workaround.unmet` returns when the machine lacks what the fix needs;
- ``auto`` **skips** with one logged reason (not ROCm, a model it does not fit, an unmet
  precondition);
- ``off`` does nothing.

A workaround that needs to know whether another one runs in the same job asks
:meth:`Context.will_apply`, answered from the job's decisions, made once before anything
applies (:func:`decide_job`); it never re-runs another workaround's gate.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import torch.nn as nn

from titan_rocm import platform
from titan_rocm.log import log
from titan_rocm.platform import PlatformFacts
from titan_rocm.settings import RocmSettings

TORCHTITAN_022 = "torchtitan 0.2.2"
"""``Context.framework`` of a job built by the 0.2.2 converters (``titan_rocm.converters``)."""
TORCHTITAN_030 = "torchtitan 0.3.0"
"""``Context.framework`` of a job built by the 0.3.0 trainer adapter (``titan_rocm.torchtitan``);
a workaround whose seam differs there picks its ``tt030`` module by this value."""

_planning: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "titan_rocm_planning", default=False
)


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """Mark workarounds run inside the block as a ``titan-rocm plan`` dry run.

    Workarounds still decide and apply to the (meta) model, but skip effects that would
    outlive the process, such as installing compile hooks or writing files.
    """
    token = _planning.set(True)
    try:
        yield
    finally:
        _planning.reset(token)


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
    job_decisions: dict[str, str | None] = field(default_factory=dict)
    """Every titan-rocm workaround this job runs: its skip reason, None where it applies.
    Filled once, before any workaround applies (:func:`decide_job`)."""

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


class TrainerSeam:
    """What a trainer adapter calls into an applied workaround at the trainer's own methods.

    TorchTitan 0.3.0's adapter subclasses the trainer (``titan_rocm.torchtitan``), so a
    workaround that must act around a step (the divergence guard) gets these calls instead of
    patching TorchTitan's classes; 0.2.2 has no such adapter and never calls them. Every
    method is a no-op here.
    """

    def attach(self, trainer: Any) -> None:
        """The trainer is built (model, loss, optimizers, checkpointer, metrics)."""

    def before_step(self, step: int) -> None:
        """Step ``step`` starts (``train_step``), before any micro-batch."""

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

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._unmet: tuple[str | None] | None = None

    @property
    def mode(self) -> str:
        """This workaround's mode from ``[rocm]``."""
        return self.ctx.mode(self.name)

    def unmet(self) -> str | None:
        """What the machine or job lacks for this fix, whatever the model (None: nothing).

        One sentence: ``on`` fails start-up with it, ``auto`` skips with it. Called at most
        once per instance.
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

    def skipped_plan(self, model: nn.Module) -> dict[str, Any]:
        """JSON-able facts worth showing when the fix does not apply: what runs instead, what
        the machine has. Never the effects the fix would have had."""
        return {}

    def unmet_reason(self) -> str | None:
        """:meth:`unmet`, asked once."""
        if self._unmet is None:
            self._unmet = (self.unmet(),)
        return self._unmet[0]

    def require(self) -> None:
        """At start-up: under ``on``, fail when :meth:`unmet` names something missing.

        Raises:
            ValueError: ``[rocm] <name> = "on" cannot apply: <what is missing>``.
        """
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
        return self.check(model) or self.unmet_reason()


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


class JobWorkarounds:
    """The titan-rocm workarounds one job runs: one instance each, all decided once, before
    any applies (so :meth:`Context.will_apply` is answered for every one of them), then
    applied in order, each at most once, whoever asks."""

    def __init__(
        self,
        ctx: Context,
        names: Sequence[str],
        instances: Mapping[str, Workaround] | None = None,
    ) -> None:
        """Build (or adopt from ``instances``) one workaround per name, in apply order."""
        from titan_rocm.workarounds.registry import workaround_class

        given = instances or {}
        self.ctx = ctx
        self.instances: dict[str, Workaround] = {
            name: given.get(name) or workaround_class(name)(ctx) for name in names
        }
        self.applied_by: dict[str, str] = {}
        """Workaround name -> who applied it (a converter name)."""
        self.decided = False

    def adopt(self, instances: Mapping[str, Workaround], model: nn.Module) -> None:
        """Take in workarounds this job did not know yet (decided at once if the job was)."""
        for name, w in instances.items():
            if name not in self.instances:
                self.instances[name] = w
                if self.decided:
                    self.ctx.job_decisions[name] = w.gate(model)

    def require(self) -> None:
        """Start-up check of every ``on`` workaround (ValueError naming what is missing)."""
        for w in self.instances.values():
            w.require()

    def decide(self, model: nn.Module) -> dict[str, str | None]:
        """Gate every workaround once; the answers go to ``ctx.job_decisions``."""
        if not self.decided:
            self.ctx.job_decisions.update({n: w.gate(model) for n, w in self.instances.items()})
            self.decided = True
        return self.ctx.job_decisions

    def apply_all(self, names: Iterable[str], model: nn.Module, by: str) -> list[Decision]:
        """:meth:`apply` each of ``names`` in order, logging one line per decision.

        Also where both adapters install the test fault ``TITAN_ROCM_DEBUG_CORRUPT`` (a no-op
        unless it is set; docs/numerics-audit-fault.md), before anything compiles.
        """
        from titan_rocm.numerics import corrupt

        corrupt.install(model)
        decisions = []
        for name in names:
            decision = self.apply(name, model, by)
            log.info("%s", decision.line)
            decisions.append(decision)
        return decisions

    def applied(self, by: str | None = None) -> list[Workaround]:
        """The workarounds that applied (by ``by`` alone, if given), in apply order."""
        return [w for name, w in self.instances.items()
                if name in self.applied_by and by in (None, self.applied_by[name])]

    def apply(self, name: str, model: nn.Module, by: str) -> Decision:
        """Apply workaround ``name`` to ``model`` if its gate held and nobody applied it yet."""
        self.decide(model)
        w = self.instances[name]
        if name in self.applied_by:
            reason: str | None = f"already applied by converter {self.applied_by[name]!r}"
            return Decision(name, by, False, reason)
        reason = self.ctx.job_decisions[name]
        if reason is not None:
            # A skipped fix has no effects to describe: only what runs instead.
            return Decision(name, by, False, reason, w.skipped_plan(model))
        w.apply(model)
        self.applied_by[name] = by
        return Decision(name, by, True, "", w.plan(model))
