"""What a TorchTitan job would get from titan-rocm, worked out on a machine without a GPU.

:func:`make_plan` reads the config exactly as TorchTitan does (its own ``ConfigManager``),
builds the model on the meta device, runs titan-rocm's converters on it under the real or a
simulated platform (``--arch``), and reports each workaround's decision and details, the
compile strategy per block and the settings in force.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn as nn

from titan_rocm import platform, register_converters
from titan_rocm.config import settings_from
from titan_rocm.converters import RocmConverter, converter_classes
from titan_rocm.job_args import JobArgsError, prepare
from titan_rocm.platform import PlatformFacts
from titan_rocm.workarounds.base import Decision, planning
from titan_rocm.workarounds.moe_blocks import EAGER_MOE, plan_blocks


class PlanError(ValueError):
    """The job cannot be planned; the message says why."""


def parse_job(args: Sequence[str]) -> Any:
    """Parse TorchTitan arguments with TorchTitan 0.2.2's own ConfigManager.

    Raises:
        PlanError: the arguments, TOML or a ``[rocm]`` value are not acceptable.
    """
    from torchtitan.config import ConfigManager

    try:
        prepared = prepare(args)
    except JobArgsError as exc:
        raise PlanError(str(exc)) from None
    try:
        return ConfigManager().parse_args(prepared)
    except SystemExit as exc:  # tyro prints its own message for bad flags
        raise PlanError(f"TorchTitan rejected the arguments (exit {exc.code})") from None
    except (ValueError, TypeError, AssertionError) as exc:
        raise PlanError(str(exc)) from None


def _world_size(job_config: Any, world_size: int | None) -> int:
    if world_size is not None:
        return world_size
    p = job_config.parallelism
    degrees = (
        p.data_parallel_replicate_degree,
        max(p.data_parallel_shard_degree, 1),
        p.context_parallel_degree,
        p.tensor_parallel_degree,
        p.pipeline_parallel_degree,
    )
    size = 1
    for d in degrees:
        size *= d
    return size


def _parallel_dims(job_config: Any, world_size: int) -> Any:
    from torchtitan.distributed import ParallelDims

    p = job_config.parallelism
    try:
        return ParallelDims(
            dp_shard=p.data_parallel_shard_degree,
            dp_replicate=p.data_parallel_replicate_degree,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree,
            ep=p.expert_parallel_degree,
            etp=p.expert_tensor_parallel_degree,
            world_size=world_size,
        )
    except AssertionError as exc:
        raise PlanError(f"parallelism does not fit world size {world_size}: {exc}") from None


def build_meta_model(job_config: Any, facts: PlatformFacts) -> tuple[nn.Module, Any]:
    """The job's model on the meta device, as TorchTitan's Trainer builds it."""
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.protocols.train_spec import get_train_spec
    from torchtitan.tools import utils

    try:
        spec = get_train_spec(job_config.model.name)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    flavors = spec.model_args
    if job_config.model.flavor not in flavors:
        raise PlanError(
            f"model {job_config.model.name!r} has no flavor {job_config.model.flavor!r}; "
            f"accepted: {', '.join(flavors)}"
        )
    model_args = copy.deepcopy(flavors[job_config.model.flavor])
    stock_moe = copy.deepcopy(getattr(model_args, "moe_args", None))
    with _quiet_local_capability_warning(facts.simulated):
        model_args.update_from_config(job_config)
    if facts.simulated and stock_moe is not None:
        # update_from_config turns grouped MM off when *this* machine lacks SM90; the
        # simulated target (gfx942 reports capability 9.4) keeps the flavor's choice.
        model_args.moe_args.use_grouped_mm = stock_moe.use_grouped_mm
    with torch.device("meta"), utils.set_default_dtype(
        TORCH_DTYPE_MAP[job_config.training.dtype]
    ):
        model = spec.model_cls(model_args)
    return model, spec


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextlib.contextmanager
def _quiet_local_capability_warning(simulated: bool) -> Iterator[None]:
    """Under ``--arch``, hide TorchTitan's warning about *this* machine lacking SM90 grouped
    MM: the plan is for the simulated GPU, which keeps the flavor's choice."""
    if not simulated:
        yield
        return
    drop = _DropMessage("Failed to use grouped mm")
    loggers = [logging.getLogger(), logging.getLogger("torchtitan")]
    for log in loggers:
        log.addFilter(drop)
    try:
        yield
    finally:
        for log in loggers:
            log.removeFilter(drop)


_STOCK_MOE_COMPILE = "stock MoE compile (children fullgraph except experts)"


def _stock_compile_blocks(per_block: dict[str, str]) -> dict[str, str]:
    """What TorchTitan 0.2.2's own apply_compile does per block (no titan-rocm patch), from
    :func:`~titan_rocm.workarounds.moe_blocks.plan_blocks`' dense/MoE split."""
    return {name: _STOCK_MOE_COMPILE if how == EAGER_MOE else how
            for name, how in per_block.items()}


def make_plan(
    args: Sequence[str],
    *,
    arch: str | None = None,
    world_size: int | None = None,
    aiter: str | None = None,
) -> dict[str, Any]:
    """Work out what the job in ``args`` (TorchTitan flags) would get from titan-rocm.

    Args:
        args: TorchTitan arguments, e.g. ``["--job.config_file", "x.toml"]``.
        arch: simulate a ROCm machine with this ``gfx`` target (default: this machine).
        world_size: number of ranks (default: the product of the explicit degrees).
        aiter: with ``arch``, the aiter that machine has (``0.1.7``, ``main``, ``absent``;
            default ``0.1.7``, what ``pip install amd-aiter`` installs).

    Raises:
        PlanError: bad arguments, config, ``[rocm]`` value, architecture or aiter choice.
    """
    register_converters()
    job_config = parse_job(args)
    try:
        facts = platform.plan_facts(arch, aiter)
    except ValueError as exc:
        raise PlanError(str(exc)) from None

    with platform.override(facts), planning():
        model, spec = build_meta_model(job_config, facts)
        parallel_dims = _parallel_dims(job_config, _world_size(job_config, world_size))
        ours = converter_classes()
        decisions: list[Decision] = []
        others: list[str] = []
        for name in job_config.model.converters:
            cls = ours.get(name)
            if cls is None:
                others.append(name)
                continue
            try:
                converter: RocmConverter = cls(job_config, parallel_dims)
            except ValueError as exc:
                raise PlanError(f"converter {name!r}: {exc}") from None
            converter.convert(model)
            decisions.extend(converter.decisions)

    compile_enabled = bool(job_config.compile.enable)
    moe_decision = next(
        (d for d in decisions if d.workaround == "moe_eager_compile" and d.applied), None
    )
    per_block = plan_blocks(model)
    if not compile_enabled:
        blocks: dict[str, str] = {}
    elif moe_decision is not None and "blocks" in moe_decision.details:
        blocks = dict(moe_decision.details["blocks"])
    else:
        blocks = _stock_compile_blocks(per_block)
    n_blocks = len(per_block)
    n_moe = sum(how == EAGER_MOE for how in per_block.values())
    return {
        "config_file": job_config.job.config_file,
        "model": {
            "name": job_config.model.name,
            "flavor": job_config.model.flavor,
            "blocks": n_blocks,
            "moe_blocks": n_moe,
            "parallelize_fn": f"{spec.parallelize_fn.__module__}.{spec.parallelize_fn.__name__}",
        },
        "platform": {
            "summary": facts.describe(),
            "simulated": facts.simulated,
            "is_rocm": facts.is_rocm,
            "arch": facts.gfx_arch,
        },
        "converters": list(job_config.model.converters),
        "other_converters": others,
        "titan_rocm_listed": any(name in ours for name in job_config.model.converters),
        "settings": dataclasses.asdict(settings_from(job_config)),
        "workarounds": [d.to_dict() for d in decisions],
        "compile": {"enabled": compile_enabled, "blocks": blocks},
    }


def _details_lines(details: dict[str, Any], indent: str) -> list[str]:
    lines = []
    for key, value in details.items():
        if key == "blocks":
            continue  # shown in the compile section
        if isinstance(value, dict) and value:
            lines.append(f"{indent}{key}:")
            lines += [f"{indent}  {k}: {v}" for k, v in value.items()]
        else:
            lines.append(f"{indent}{key}: {value}")
    return lines


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as text for people."""
    m = plan["model"]
    lines = [
        f"job:      {plan['config_file'] or '(no TOML; flags and defaults)'}",
        f"model:    {m['name']} {m['flavor']}: {m['blocks']} blocks, {m['moe_blocks']} MoE",
        f"platform: {plan['platform']['summary']}",
        f"converters: {', '.join(plan['converters']) or '(none)'}",
    ]
    if not plan["titan_rocm_listed"]:
        lines.append("  " + plan.get(
            "not_listed_advice",
            "titan-rocm is not listed: add \"rocm\" to [model] converters "
            "(or pass --model.converters rocm) to apply its workarounds",
        ))
    for name in plan["other_converters"]:
        lines.append(f"  {name}: TorchTitan converter, applied by TorchTitan (not simulated here)")
    lines.append("")
    lines.append("workarounds:")
    for d in plan["workarounds"]:
        status = "applied" if d["applied"] else f"skipped: {d['reason']}"
        lines.append(f"  rocm.{d['workaround']:<18} {status}   [{d['converter']}]")
        lines += _details_lines(d["details"], "      ")
    lines.append("")
    comp = plan["compile"]
    if not comp["enabled"]:
        lines.append("compile: disabled ([compile] enable = false): every block runs eager")
    else:
        lines.append("compile, per TransformerBlock:")
        lines += [f"  layers.{name}: {how}" for name, how in comp["blocks"].items()]
    lines.append("")
    lines.append("settings in force ([rocm]):")
    lines += [f"  {k} = {v!r}" for k, v in plan["settings"].items()]
    return "\n".join(lines)
