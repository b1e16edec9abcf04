"""What a TorchTitan 0.2.2 job would get from titan-rocm, worked out without a GPU: the model
built on the meta device and the converters run on it (docs/plan.md)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch.nn as nn

from titan_rocm import platform, register_converters
from titan_rocm.adapters.meta import on_meta
from titan_rocm.adapters.tt022.config import settings_from
from titan_rocm.adapters.tt022.converters import RocmConverter, converter_classes
from titan_rocm.adapters.tt022.preflight import (
    DEFAULT_LAUNCHER,
    PlanError,
    check_job,
    startup_step,
)
from titan_rocm.measured import FIGURES
from titan_rocm.plan_format import PLAN_SCHEMA, format_plan
from titan_rocm.platform import PlatformFacts
from titan_rocm.workarounds.base import planning
from titan_rocm.workarounds.job import Decision
from titan_rocm.workarounds.moe_blocks import EAGER_MOE, plan_blocks

__all__ = ["PLAN_SCHEMA", "PlanError", "compile_summary", "format_plan", "make_plan"]


def build_meta_model(job_config: Any, facts: PlatformFacts) -> tuple[nn.Module, Any]:
    """The job's model on the meta device, as TorchTitan's Trainer builds it."""
    from torchtitan.protocols.train_spec import get_train_spec

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
    return on_meta(lambda: spec.model_cls(model_args), job_config.training.dtype), spec


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextlib.contextmanager
def _quiet_local_capability_warning(simulated: bool) -> Iterator[None]:
    """Under ``--arch``, TorchTitan's warning about *this* machine lacking SM90 grouped MM is wrong:
    the plan is for the simulated GPU."""
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
_STOCK_WHOLE_MOE = "fullgraph (stock: the whole MoE block)"
_NOT_COMPILED = "not compiled"



def _stock_compile_blocks(per_block: dict[str, str], parallelize_fn: Any) -> dict[str, str]:
    """TorchTitan 0.2.2's own ``apply_compile`` per block, without titan-rocm."""
    import inspect

    from titan_rocm.workarounds.moe_eager_compile.seams_tt022 import stock_apply_compile

    stock = stock_apply_compile(parallelize_fn)
    if stock is None:  # e.g. gpt_oss: its parallelize_fn compiles no blocks
        return {name: _NOT_COMPILED for name in per_block}
    # llama4's (imported by qwen3 and deepseek_v3) takes ep_enabled and splits MoE blocks;
    # llama3's compiles every block whole.
    splits_moe = "ep_enabled" in inspect.signature(stock).parameters
    moe = _STOCK_MOE_COMPILE if splits_moe else _STOCK_WHOLE_MOE
    return {name: moe if how == EAGER_MOE else how for name, how in per_block.items()}


def compile_summary(blocks: dict[str, str], moe_blocks: int, scope: str | None) -> str:
    """One sentence: how many blocks compile whole, what happens to the MoE blocks, the cost."""
    whole = sum(how.startswith("fullgraph") for how in blocks.values())
    if not any(how != _NOT_COMPILED for how in blocks.values()):
        return "no block is compiled: this model's parallelize_fn compiles none"
    text = f"{whole} of {len(blocks)} blocks compiled whole (fullgraph)"
    if scope is None or not moe_blocks:
        return text
    if scope == "block":
        what = f"{moe_blocks} MoE blocks run eager whole"
    else:
        what = f"{moe_blocks} MoE blocks: attention and norms compiled, the MoE module eager"
    if whole == 0 and scope == "block":
        what += "; nothing is compiled per block"
    cost = FIGURES.get(f"moe_eager_compile.{scope}")
    measured = f"; measured {cost.sentence()}" if cost else ""
    return f"{text}; {what} (rocm.moe_eager_compile, moe_eager_scope = \"{scope}\"{measured})"


def make_plan(
    args: Sequence[str],
    *,
    arch: str | None = None,
    world_size: int | None = None,
    nnodes: int | None = None,
    nproc_per_node: int | None = None,
    launcher: str = DEFAULT_LAUNCHER,
    aiter: str | None = None,
    primus_turbo: str | None = None,
) -> dict[str, Any]:
    """Work out what the job in ``args`` (TorchTitan flags) would get from titan-rocm; ``arch``,
    ``aiter`` and ``primus_turbo`` simulate a ROCm machine.

    Raises StartupError when the job would stop at start-up, or PlanError for an unknown
    architecture, aiter choice or model flavor."""
    register_converters()
    pre = check_job(args, launcher=launcher, world_size_flag=world_size, nnodes=nnodes,
                    nproc_per_node=nproc_per_node)
    job_config = pre.job_config
    try:
        facts = platform.planned_facts(arch, aiter, primus_turbo)
    except ValueError as exc:
        raise PlanError(str(exc)) from None

    with platform.override(facts), planning():
        with startup_step("TorchTitan 0.2.2 would fail building the model"):
            model, spec = build_meta_model(job_config, facts)
        parallel_dims = pre.parallel_dims
        ours = converter_classes()
        decisions: list[Decision] = []
        others: list[str] = []
        for name in job_config.model.converters:
            cls = ours.get(name)
            if cls is None:
                others.append(name)
                continue
            with startup_step(f"converter {name!r} would stop the job at start-up"):
                converter: RocmConverter = cls(job_config, parallel_dims)
                converter.convert(model)
            decisions.extend(converter.decisions)

    compile_config = job_config.compile
    compile_enabled = bool(compile_config.enable and "model" in compile_config.components)
    moe_decision = next(
        (d for d in decisions if d.workaround == "moe_eager_compile" and d.applied), None
    )
    per_block = plan_blocks(model)
    n_blocks = len(per_block)
    n_moe = sum(how == EAGER_MOE for how in per_block.values())
    scope = None
    if not compile_enabled:
        blocks: dict[str, str] = {}
    elif moe_decision is not None and "blocks" in moe_decision.details:
        blocks = dict(moe_decision.details["blocks"])
        scope = moe_decision.details.get("scope")
    else:
        blocks = _stock_compile_blocks(per_block, spec.parallelize_fn)
    return {
        "schema": PLAN_SCHEMA,
        "config_file": job_config.job.config_file,
        "model": {
            "name": job_config.model.name,
            "flavor": job_config.model.flavor,
            "blocks": n_blocks,
            "moe_blocks": n_moe,
            "parallelize_fn": f"{spec.parallelize_fn.__module__}.{spec.parallelize_fn.__name__}",
        },
        "launcher": pre.launcher,
        "world_size": pre.world.to_dict(),
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
        "compile": {
            "enabled": compile_enabled,
            "blocks": blocks,
            "summary": compile_summary(blocks, n_moe, scope) if compile_enabled else None,
        },
    }
