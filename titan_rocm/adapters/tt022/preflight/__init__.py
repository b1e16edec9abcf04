"""The start-up checks TorchTitan 0.2.2 makes before it touches a GPU, made on a login node
(docs/plan.md, "What plan checks, in TorchTitan's order")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from titan_rocm.adapters.common import (
    PlanError,
    StartupError,
    WorldSize,
    check_counts,
    check_world_flags,
    degrees,
    world_size,
)
from titan_rocm.adapters.common import one_line as _one_line
from titan_rocm.adapters.tt022.preflight.custom_import import check_custom_import
from titan_rocm.adapters.tt022.preflight.launchers import DEFAULT_LAUNCHER, LAUNCHERS
from titan_rocm.adapters.tt022.preflight.model_converters import (
    check_converters,
    check_quantization,
    registered_converters,
)
from titan_rocm.adapters.tt022.preflight.parallel_dims import check_parallelism
from titan_rocm.adapters.tt022.preflight.parse_args import (
    bool_flags,
    check_bool_flags,
    check_toml_types,
    parse_config,
)
from titan_rocm.adapters.tt022.preflight.training import check_training


@dataclass
class Preflight:
    """A job that passed every start-up check: its config and parallel layout."""

    job_config: Any
    launcher: str
    world: WorldSize
    parallel_dims: Any


def check_job(
    args: Sequence[str],
    *,
    launcher: str = DEFAULT_LAUNCHER,
    world_size_flag: int | None = None,
    nnodes: int | None = None,
    nproc_per_node: int | None = None,
    prog: str = "titan-rocm plan",
) -> Preflight:
    """Every GPU-free start-up check TorchTitan 0.2.2 would make (StartupError for the first that
    fails, with the fix)."""
    if launcher not in LAUNCHERS:
        raise StartupError(f"unknown launcher {launcher!r}; accepted: {', '.join(LAUNCHERS)}")
    check_counts(world_size_flag, nnodes, nproc_per_node)  # bad flags before the TOML
    job_config = parse_config(args, launcher, prog)
    check_custom_import(job_config)
    d = degrees(job_config)
    world = world_size(d, world_size_flag, nnodes, nproc_per_node)
    parallel_dims = check_parallelism(d, world)
    check_training(job_config, parallel_dims)
    registered = registered_converters(job_config, launcher)
    check_converters(job_config, registered)
    check_quantization(job_config)
    return Preflight(job_config, launcher, world, parallel_dims)


@contextlib.contextmanager
def startup_step(what: str) -> Iterator[None]:
    """Any exception inside becomes a :class:`StartupError`: TorchTitan's own start-up runs
    ``what``, so the job would stop there too."""
    try:
        yield
    except StartupError:
        raise
    except Exception as exc:
        raise StartupError(f"{what}: {_one_line(exc)}") from None


__all__ = [
    "DEFAULT_LAUNCHER",
    "LAUNCHERS",
    "PlanError",
    "Preflight",
    "StartupError",
    "WorldSize",
    "bool_flags",
    "check_bool_flags",
    "check_job",
    "check_parallelism",
    "check_toml_types",
    "check_world_flags",
    "parse_config",
    "registered_converters",
    "startup_step",
    "world_size",
]
