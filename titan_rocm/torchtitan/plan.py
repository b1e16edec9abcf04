"""``titan-rocm plan --module M --config F [flags] [--arch gfx942]`` for TorchTitan 0.3.0 jobs.

Reads the job as ``python -m torchtitan.train`` would (TorchTitan's ``ConfigManager``: the
config function, then the command line through tyro), builds the model on the meta device
as ``Trainer.__init__`` does (``update_from_config``, then ``model_config.build()``), and runs
the same :class:`~titan_rocm.torchtitan.job.RocmJob` a ``RocmTrainer`` would, under the real
or a simulated platform. The result has the shape of the 0.2.2 plan
(:func:`titan_rocm.plan.make_plan`) and prints with the same formatter.

titan-rocm runs in a 0.3.0 job when its config is a ``RocmTrainer`` config (``rocm(cfg)``,
``--module titan_rocm.torchtitan.configs``) or when it lists the override entry; otherwise the
plan says so and shows what the defaults would do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from titan_rocm import platform
from titan_rocm.job_args import CONFIG_FILE_FLAGS, flag_value
from titan_rocm.preflight import PlanError, StartupError, WorldSize, degrees, world_size
from titan_rocm.settings import RocmSettings, check_section
from titan_rocm.torchtitan.job import RocmJob
from titan_rocm.torchtitan.override import ENTRY
from titan_rocm.workarounds.base import planning
from titan_rocm.workarounds.moe_blocks import EAGER_MOE, eager_mark, plan_blocks

NOT_ATTACHED = (
    "titan-rocm is not attached to this job: use --module titan_rocm.torchtitan.configs, "
    f"return rocm(cfg) from the config function, or add --override.imports {ENTRY}; "
    "shown: what its defaults would do"
)


def parse_job(args: Sequence[str]) -> Any:
    """The job's ``Trainer.Config``, parsed by TorchTitan 0.3.0's own ``ConfigManager``.

    Raises:
        PlanError: ``--module``/``--config`` missing or unknown, or a flag TorchTitan rejects.
    """
    from torchtitan.config import ConfigManager

    if any(arg.partition("=")[0] in CONFIG_FILE_FLAGS for arg in args):
        raise PlanError(
            "--job.config_file is TorchTitan 0.2.2's; torchtitan 0.3.0 is installed: "
            "plan a 0.3.0 job with --module M --config F"
        )
    try:
        return ConfigManager().parse_args(list(args))
    except SystemExit as exc:  # tyro prints its own message for bad flags
        raise PlanError(f"TorchTitan rejected the arguments (exit {exc.code})") from None
    except (ValueError, TypeError, ImportError, AssertionError) as exc:
        raise PlanError(str(exc)) from None


def settings_of(config: Any) -> tuple[RocmSettings, str | None]:
    """titan-rocm's settings for the job, and how it is attached (None: it is not)."""
    settings = getattr(config, "rocm", None)
    if isinstance(settings, RocmSettings):
        return settings, f"{type(config).__qualname__} (rocm(cfg))"
    for entry in config.override.imports:
        target, kwargs = (entry, {}) if isinstance(entry, str) else entry
        if target == ENTRY:
            try:
                return check_section(dict(kwargs)), f"--override.imports {ENTRY}"
            except ValueError as exc:
                raise PlanError(str(exc)) from None
    return RocmSettings(), None


def _parallel_dims(config: Any, size: int | None, nnodes: int | None,
                   nproc_per_node: int | None) -> tuple[Any, WorldSize]:
    """The job's ``ParallelDims`` on the world size given, or the smallest its degrees fit
    (the same rule as 0.2.2's plan, :func:`titan_rocm.preflight.world_size`), and that size."""
    from torchtitan.distributed import ParallelDims

    try:
        world = world_size(degrees(config), size, nnodes, nproc_per_node)
    except StartupError as exc:
        raise PlanError(str(exc)) from None
    try:
        return ParallelDims.from_config(config.parallelism, world.size), world
    except AssertionError as exc:
        raise PlanError(f"parallelism does not fit world size {world.size}: {exc}") from None


def build_meta_model(config: Any) -> torch.nn.Module:
    """The job's model on the meta device, as ``Trainer.__init__`` builds it."""
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools import utils

    if config.model_spec is None:
        raise PlanError("the config function returned a config without model_spec")
    model_config = config.model_spec.model
    try:
        model_config.update_from_config(config=config)
    except (ValueError, NotImplementedError, AssertionError) as exc:
        raise PlanError(str(exc)) from None
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        return model_config.build()


def compile_per_block(model: torch.nn.Module, enabled: bool) -> dict[str, str]:
    """What each block will run as: 0.3.0's ``apply_compile`` compiles every block whole, in
    place; a block a workaround marked runs eager after ``parallelize_fn``."""
    if not enabled:
        return {}
    result = {}
    for layer_id, how in plan_blocks(model).items():
        marked = eager_mark(model.layers[layer_id])
        stock = "fullgraph, in place (stock apply_compile" + (
            ", MoE block included)" if how == EAGER_MOE else ")")
        result[layer_id] = marked or stock
    return result


def make_plan(args: Sequence[str], *, arch: str | None = None, size: int | None = None,
              nnodes: int | None = None, nproc_per_node: int | None = None,
              aiter: str | None = None, primus_turbo: str | None = None) -> dict[str, Any]:
    """Work out what the TorchTitan 0.3.0 job in ``args`` would get from titan-rocm
    (``arch``, ``aiter``, ``primus_turbo``: the simulated machine; ``size``, ``nnodes``,
    ``nproc_per_node``: its ranks; both as for 0.2.2's plan).

    Raises:
        PlanError: bad arguments, config, setting, architecture or aiter choice.
    """
    config = parse_job(args)
    settings, attached = settings_of(config)
    try:
        facts = platform.planned_facts(arch, aiter, primus_turbo)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    with platform.override(facts), planning():
        model = build_meta_model(config)
        job = RocmJob(settings)
        parallel_dims, world = _parallel_dims(config, size, nnodes, nproc_per_node)
        try:
            job.start(config, parallel_dims)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        decisions = job.apply(model)
    spec = config.model_spec
    per_block = plan_blocks(model)
    module, name = flag_value(args, ("--module",)), flag_value(args, ("--config",))
    fn = spec.parallelize_fn
    plan = {
        "config_file": f"--module {module} --config {name}",
        "model": {
            "name": spec.name,
            "flavor": spec.flavor,
            "blocks": len(per_block),
            "moe_blocks": sum(how == EAGER_MOE for how in per_block.values()),
            "parallelize_fn": f"{fn.__module__}.{fn.__name__}",
        },
        "platform": {"summary": facts.describe(), "simulated": facts.simulated,
                     "is_rocm": facts.is_rocm, "arch": facts.gfx_arch},
        "torchtitan": "0.3.0",
        "world_size": world.to_dict(),
        "converters": [attached] if attached else [],
        "other_converters": [],
        "titan_rocm_listed": attached is not None,
        "not_listed_advice": NOT_ATTACHED,
        "settings": dataclasses.asdict(settings),
        "workarounds": [d.to_dict() for d in decisions],
        "compile": {"enabled": job.ctx is not None and job.ctx.compile.model,
                    "blocks": compile_per_block(model, bool(config.compile.enable and
                                                            "model" in config.compile.components))},
    }
    return plan
