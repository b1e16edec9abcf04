"""The start-up checks TorchTitan 0.2.2 makes before it touches a GPU, made on a login node.

``titan-rocm plan`` calls :func:`check_job` first: it reads the job as the chosen launcher
would (``torchrun -m torchtitan.train``, or titan-rocm's ``python -m titan_rocm.train``,
which adds ``custom_config_module`` and registers titan-rocm's converters itself) and raises
:class:`StartupError` with one sentence for every failure TorchTitan would stop on at
start-up that needs no GPU, in TorchTitan's order where it matters, one module per check
(``parse_args``, ``custom_import``, ``parallel_dims``, ``training``, ``model_converters``):

1. ``ConfigManager.parse_args``: the TOML (unreadable, not TOML, not UTF-8), the
   ``custom_config_module`` import, unknown keys, the command line (tyro); plus what 0.2.2
   passes through unchecked from the TOML: values of the wrong type (``"two"`` for an
   integer; ``converters = "rocm"``, which 0.2.2 iterates letter by letter). Boolean flags
   given a value (``--rocm.triton_war_strict true``) are named with the bare form to use.
2. ``Trainer.__init__``: the ``[experimental] custom_import`` import.
3. ``ParallelDims`` and its device mesh: every degree against the world size (given with
   ``--world-size`` or ``--nnodes``/``--nproc-per-node``, else derived and said so).
4. The train spec, pipelining support, and the batch-size arithmetic.
5. ``build_model_converters``: each ``[model] converters`` name against TorchTitan's real
   registry, where titan-rocm's names count only when the job would import ``titan_rocm``;
   TorchTitan's quantization converters' own first check (one quantization type per job).

Model construction and titan-rocm's own converters run afterwards in
:mod:`titan_rocm.adapters.tt022.plan`,
inside :func:`startup_step`.
"""

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
    """Every GPU-free start-up check TorchTitan 0.2.2 would make on the job in ``args``.

    Raises:
        StartupError: the first check that fails, in one sentence with the fix.
    """
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
    """Turn any exception raised inside into a :class:`StartupError`: ``what`` is a step
    TorchTitan's own start-up runs (building the model, its converters), so the job would
    stop there too."""
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
"""What the plan, the launcher, the audit, the CLI and the tests use of the checks."""
