"""TorchTitan 0.2.2's converter class for titan-rocm: runs a fixed list of workarounds.

The job's :class:`~titan_rocm.workarounds.job.JobWorkarounds` lives on the model, so a
workaround listed twice applies once. 0.2.2 has no trainer adapter, so the job hooks where
every trainer ends (``MetricsProcessor.close``) and starts (``CheckpointManager.load``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import torch.nn as nn

from titan_rocm.adapters import stop
from titan_rocm.adapters.tt022.converters.context import job_context
from titan_rocm.workarounds.base import Workaround
from titan_rocm.workarounds.job import Decision, JobWorkarounds
from titan_rocm.workarounds.registry import WORKAROUNDS, workaround_class

UMBRELLA = "rocm"
"""The converter that runs every workaround; ``rocm.<name>`` runs one."""

JOB_ATTR = "_titan_rocm_job"
TEARDOWN = "titan-rocm job teardown"


def _closing_jobs(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def close(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            for part in getattr(self, "model_parts", None) or []:
                job = getattr(part, "__dict__", {}).get(JOB_ATTR)
                if job is not None:
                    job.close()

    return close


def _job_of_trainer(trainer: Any) -> JobWorkarounds | None:
    for part in getattr(trainer, "model_parts", None) or []:
        job = getattr(part, "__dict__", {}).get(JOB_ATTR)
        if job is not None:
            return job
    return None


def _stopping(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        trainer = (getattr(self, "states", None) or {}).get("train_state")
        job = _job_of_trainer(trainer)
        if job is not None:
            stop.install(trainer, job.patches)
        return result

    return load


def hook_teardown(job: JobWorkarounds) -> None:
    """Close ``job`` when its trainer closes, and end a stopped run with its exit code once training
    starts (not in a plan: nothing trains there)."""
    if job.ctx.planning:
        return
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.metrics import MetricsProcessor

    job.patches.patch(MetricsProcessor, "close", _closing_jobs, by=TEARDOWN)
    job.patches.patch(CheckpointManager, "load", _stopping, by=stop.BY)


def workarounds_of(converter_names: list[str] | tuple[str, ...]) -> list[str]:
    """The workarounds the titan-rocm converters among ``converter_names`` run, in apply order."""
    wanted: set[str] = set()
    for name in converter_names:
        if name == UMBRELLA:
            wanted.update(WORKAROUNDS)
        elif name.startswith(UMBRELLA + ".") and name[len(UMBRELLA) + 1:] in WORKAROUNDS:
            wanted.add(name[len(UMBRELLA) + 1:])
    return [name for name in WORKAROUNDS if name in wanted]


class RocmConverter:
    """A TorchTitan model converter running a fixed list of workarounds."""

    converter_name: ClassVar[str]
    workaround_names: ClassVar[tuple[str, ...]]

    def __init__(self, job_config: Any, parallel_dims: Any) -> None:
        self.ctx = job_context(job_config, parallel_dims)
        self.workarounds: dict[str, Workaround] = {
            cls.name: cls(self.ctx) for cls in self.workaround_classes()
        }
        for w in self.workarounds.values():
            w.require()  # `on` fails here, at start-up, naming what is missing
        self.decisions: list[Decision] = []
        self._job: JobWorkarounds | None = None

    @classmethod
    def workaround_classes(cls) -> list[type[Workaround]]:
        """The workaround classes this converter runs, in order (looked up by name)."""
        return [workaround_class(name) for name in cls.workaround_names]

    def _job_of(self, model: nn.Module) -> JobWorkarounds:
        job = model.__dict__.get(JOB_ATTR)
        if job is None:
            names = workarounds_of(self.ctx.converters)
            names += [n for n in self.workarounds if n not in names]
            job = JobWorkarounds(self.ctx, names, self.workarounds)
            model.__dict__[JOB_ATTR] = job
            hook_teardown(job)
        else:
            job.adopt(self.workarounds, model)
        return job

    def convert(self, model: nn.Module) -> None:
        """Apply every workaround whose gate holds; log one line per workaround."""
        self._job = self._job_of(model)
        self.decisions += self._job.apply_all(self.workarounds, model, self.converter_name)

    def post_optimizer_hook(self, model: nn.Module | list[nn.Module]) -> None:
        """Forward TorchTitan's post-optimizer hook to the workarounds this converter applied."""
        parts = model if isinstance(model, list) else [model]
        if self._job is not None:
            for w in self._job.applied(self.converter_name):
                w.post_optimizer_hook(parts)
