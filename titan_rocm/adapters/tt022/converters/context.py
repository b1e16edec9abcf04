"""The workarounds' :class:`~titan_rocm.workarounds.base.Context` of a TorchTitan 0.2.2 job: the
only place it is made."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from titan_rocm import platform, torchtitan_version
from titan_rocm.adapters.tt022.config import settings_from
from titan_rocm.workarounds.base import TORCHTITAN_022, CompileSettings, Context, Parallelism
from titan_rocm.workarounds.seams import TT022

FRAMEWORK = TORCHTITAN_022


def parallelize_fn_of(model_name: str | None) -> Callable[..., Any] | None:
    if not model_name:
        return None
    from torchtitan.protocols.train_spec import get_train_spec

    try:
        return get_train_spec(model_name).parallelize_fn
    except ValueError:
        return None


def job_context(job_config: Any, parallel_dims: Any) -> Context:
    """The :class:`Context` of a TorchTitan 0.2.2 job (ValueError for a bad ``[rocm]`` value)."""
    settings = settings_from(job_config)  # validates first: a bad value fails before anything
    compile_config = getattr(job_config, "compile", None)
    model = getattr(job_config, "model", None)
    training = getattr(job_config, "training", None)
    debug = getattr(job_config, "debug", None)
    model_name = getattr(model, "name", None)
    return Context(
        settings=settings,
        platform=platform.current(),
        model_name=model_name,
        flavor=getattr(model, "flavor", None),
        compile=CompileSettings(
            enable=bool(getattr(compile_config, "enable", False)),
            backend=getattr(compile_config, "backend", None) or "inductor",
            components=tuple(getattr(compile_config, "components", ("model", "loss"))),
        ),
        parallel=Parallelism.of(parallel_dims),
        training_dtype=str(getattr(training, "dtype", "float32")),
        mixed_precision_param=str(getattr(training, "mixed_precision_param", "bfloat16")),
        deterministic=bool(getattr(debug, "deterministic", False)),
        converters=tuple(getattr(model, "converters", None) or ()),
        parallelize_fn=parallelize_fn_of(model_name),
        framework=FRAMEWORK,
        # The installed TorchTitan's seams: its variants' (main's folded tokens) and moved ones.
        generation=TT022.for_installed(torchtitan_version.detect()),
    )
