"""``titan-rocm plan`` for TorchTitan 0.3.0 jobs (docs/plan.md).

The model is built on the meta device as ``Trainer.__init__`` does, so the plan runs the same
:class:`~titan_rocm.adapters.tt030.job.RocmJob` a ``RocmTrainer`` would."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from titan_rocm import platform
from titan_rocm.adapters.common import (
    JobArgsError,
    PlanError,
    StartupError,
    WorldSize,
    degrees,
    flag_value,
    module_and_config,
    prog_name,
    world_size,
)
from titan_rocm.adapters.meta import on_meta
from titan_rocm.adapters.tt030.job import OVERRIDE_ENTRY as ENTRY
from titan_rocm.adapters.tt030.job import RocmJob
from titan_rocm.adapters.tt030.job_args import refuse_config_file
from titan_rocm.plan_format import PLAN_SCHEMA
from titan_rocm.settings import RocmSettings, check_flags, check_section
from titan_rocm.workarounds.base import planning
from titan_rocm.workarounds.moe_blocks import EAGER_MOE, eager_mark, plan_blocks

NOT_CHECKED = [
    "TorchTitan 0.3.0's batch-size arithmetic and pipelining support (0.2.2's plan checks "
    "them; this one checks the parallel degrees and the expert mesh only)",
]
"""Printed under "not simulated"."""

NOT_ATTACHED = (
    "titan-rocm is not attached to this job: use --module titan_rocm.torchtitan.configs, "
    f"return rocm(cfg) from the config function, or add --override.imports {ENTRY}; "
    "shown: what its defaults would do"
)


def parse_job(args: Sequence[str]) -> Any:
    """The job's ``Trainer.Config``, parsed by TorchTitan 0.3.0's own ``ConfigManager``
    (PlanError)."""
    from torchtitan.config import ConfigManager

    try:
        refuse_config_file(args)
    except JobArgsError as exc:
        raise PlanError(str(exc)) from None
    for flag in ("--module", "--config"):
        value = flag_value(args, (flag,))
        if value is not None and not value.strip():
            raise PlanError(f"{flag} {value!r} is not valid; accepted: "
                            + ("a module such as llama3, deepseek_v3 or "
                               "titan_rocm.torchtitan.configs" if flag == "--module" else
                               "the name of a config function of the module"))
    _load_config(list(args))
    try:
        check_flags(args)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    try:
        with prog_name("titan-rocm plan"):  # tyro's box: "For full helptext, run <it> --help"
            return ConfigManager().parse_args(list(args))
    except SystemExit as exc:  # tyro prints its own message for bad flags
        raise PlanError(
            f"TorchTitan rejected the arguments (exit {exc.code}; the box above says which); "
            f"titan-rocm plan {_job_flags(args)} --help-torchtitan lists this job's flags"
        ) from None
    except (ValueError, TypeError, ImportError, AssertionError) as exc:
        raise PlanError(str(exc)) from None


def _job_flags(args: Sequence[str]) -> str:
    return " ".join(f"{f} {flag_value(args, (f,))}" for f in ("--module", "--config")
                    if flag_value(args, (f,)) is not None)


def torchtitan_help(args: Sequence[str], prog: str = "titan-rocm plan") -> int:
    """Print TorchTitan 0.3.0's own help for the job (its flags depend on the job's config); return
    its exit code."""
    from torchtitan.config import ConfigManager

    _load_config(list(args))
    with prog_name(prog):
        try:
            ConfigManager().parse_args([*args, "--help"])
        except SystemExit as exc:
            return int(exc.code or 0)
    return 0


SHORTHAND_PREFIXES = ("torchtitan.models", "torchtitan.experiments",
                      "torchtitan.experiments.rl.examples")
"""TorchTitan 0.3.0's ``ConfigManager._load_config`` order (``torchtitan/config/manager.py``)."""


def _is_absent(exc: ImportError, candidate: str) -> bool:
    """``candidate`` itself (or a package above it) does not exist, not an import inside it
    failing."""
    name = getattr(exc, "name", None)
    return isinstance(exc, ModuleNotFoundError) and name is not None and (
        candidate == name or candidate.startswith(name + "."))


def _config_module(module_name: str, job: str) -> Any:
    """None when none exists (TorchTitan's own sentence names what is accepted); PlanError when a
    candidate exists but does not import."""
    import importlib

    from torchtitan.experiments import _supported_experiments
    from torchtitan.models import _supported_models

    shorthand = module_name in _supported_models | _supported_experiments
    if shorthand:
        candidates = [f"{prefix}.{module_name}.config_registry" for prefix in SHORTHAND_PREFIXES]
    else:
        candidates = [f"{module_name}.config_registry", module_name]
    for candidate in candidates:
        # A parent that fails to import fails its .config_registry: name the user's module.
        named = candidate if shorthand else module_name
        try:
            return importlib.import_module(candidate)
        except ImportError as exc:
            if _is_absent(exc, candidate):
                continue
            raise PlanError(f"{job}: importing {named} failed with {type(exc).__name__}: "
                            f"{exc}; install what it names or fix that import") from None
        except (SyntaxError, RecursionError):
            raise  # _load_config's sentences
        except Exception as exc:  # noqa: BLE001 - the user's module: one sentence
            raise PlanError(f"{job}: importing {named} raised {type(exc).__name__}: "
                            f"{exc}") from None
    return None


def _config_function(args: list[str], job: str) -> Any:
    """Found as TorchTitan finds it; None when TorchTitan's own sentence says what is wrong."""
    module_name, config_name = module_and_config(args)
    if not module_name or not config_name:
        return None
    module = _config_module(module_name, job)
    if module is None:
        return None
    fn = getattr(module, config_name, None)
    if fn is None or callable(fn):
        return fn
    available = sorted(n for n in dir(module) if not n.startswith("_") and n[0].islower()
                       and callable(getattr(module, n)))
    raise PlanError(f"{job}: {module.__name__}.{config_name} is "
                    f"{type(fn).__name__} {fn!r:.40}, not a function; accepted: a config "
                    f"function of {module.__name__} ({', '.join(available) or 'it has none'})")


def _load_config(args: list[str]) -> None:
    """As ``ConfigManager._load_config`` does, whatever the user's module does wrong (an exception,
    recursion, ``sys.exit``, a non-config return) turned into one sentence."""
    from torchtitan.config import ConfigManager

    load = getattr(ConfigManager(), "_load_config", None)
    if load is None:  # another 0.3.x: parse_args reports what it can
        return
    job = _job_flags(args)
    fn = None
    try:
        fn = _config_function(args, job)
        if fn is None:  # TorchTitan's own sentence: flags, module or name not found
            load(args)
            return
        loaded = fn()
    except PlanError:
        raise
    except SyntaxError as exc:
        raise PlanError(f"{job}: the module does not compile: {exc.filename}, line "
                        f"{exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise PlanError(f"{job}: the config function recursed without end "
                        "(RecursionError)") from None
    except SystemExit as exc:
        raise PlanError(f"{job}: importing the module or calling the config function called "
                        f"sys.exit({exc.code!r}) instead of returning a config") from None
    except (ValueError, ImportError) as exc:
        if fn is None:  # TorchTitan's own messages: module, function
            raise PlanError(str(exc)) from None
        raise PlanError(f"{job}: the config function raised {type(exc).__name__}: "
                        f"{exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's code: one sentence, no traceback
        raise PlanError(f"{job}: the config function raised {type(exc).__name__}: "
                        f"{exc}") from None
    if not dataclasses.is_dataclass(loaded) or isinstance(loaded, type):
        raise PlanError(f"{job}: the config function returned {loaded!r:.80} "
                        f"({type(loaded).__name__}); accepted: a Trainer.Config (e.g. "
                        "return rocm(cfg))")


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
    from torchtitan.distributed import ParallelDims

    try:
        world = world_size(degrees(config), size, nnodes, nproc_per_node)
    except StartupError as exc:
        raise PlanError(str(exc)) from None
    try:
        dims = ParallelDims.from_config(config.parallelism, world.size)
    except AssertionError as exc:
        raise PlanError(f"parallelism does not fit world size {world.size}: {exc}") from None
    check_expert_mesh(dims, world)
    return dims, world


def check_expert_mesh(dims: Any, world: WorldSize) -> None:
    """0.3.0 leaves the expert mesh's arithmetic to ``build_mesh``
    (``distributed/parallel_dims.py``: ``efsdp = fsdp * tp // ep``, ``ep`` divides ``dp_shard
    x cp x tp``); checked here as 0.2.2's plan checks its own (PlanError)."""
    dense = dims.dp_shard * dims.cp * dims.tp
    if dims.ep > 1 and dense % dims.ep:
        raise PlanError(
            f"expert_parallel_degree {dims.ep} does not divide dp_shard {dims.dp_shard} x cp "
            f"{dims.cp} x tp {dims.tp} = {dense} on world size {world.size} ({world.source}), "
            "so TorchTitan 0.3.0 cannot build its expert device mesh (ParallelDims.build_mesh)"
        )


def build_meta_model(config: Any) -> torch.nn.Module:
    """The job's model on the meta device, as ``Trainer.__init__`` builds it."""
    if config.model_spec is None:
        raise PlanError("the config function returned a config without model_spec")
    model_config = config.model_spec.model
    try:
        model_config.update_from_config(config=config)
    except (ValueError, NotImplementedError, AssertionError) as exc:
        raise PlanError(str(exc)) from None
    return on_meta(model_config.build, config.training.dtype)


def compile_per_block(model: torch.nn.Module, enabled: bool) -> dict[str, str]:
    """0.3.0's ``apply_compile`` compiles every block whole; a block a workaround marked runs
    eager."""
    if not enabled:
        return {}
    result = {}
    for layer_id, how in plan_blocks(model).items():
        marked = eager_mark(model.layers[layer_id])
        stock = "fullgraph, in place (stock apply_compile" + (
            ", MoE block included)" if how == EAGER_MOE else ")")
        result[layer_id] = marked or stock
    return result


def make_plan(args: Sequence[str], *, arch: str | None = None, world_size: int | None = None,
              nnodes: int | None = None, nproc_per_node: int | None = None,
              aiter: str | None = None, primus_turbo: str | None = None) -> dict[str, Any]:
    """What the 0.3.0 job in ``args`` would get from titan-rocm on the simulated machine
    (PlanError)."""
    config = parse_job(args)
    settings, attached = settings_of(config)
    try:
        facts = platform.planned_facts(arch, aiter, primus_turbo)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    with platform.override(facts), planning():
        model = build_meta_model(config)
        job = RocmJob(settings)
        parallel_dims, world = _parallel_dims(config, world_size, nnodes, nproc_per_node)
        try:
            job.start(config, parallel_dims)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        decisions = job.apply(model)
    spec = config.model_spec
    per_block = plan_blocks(model)
    module, name = module_and_config(args)
    fn = spec.parallelize_fn
    plan = {
        "schema": PLAN_SCHEMA,
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
        "not_checked": NOT_CHECKED,
        "settings": dataclasses.asdict(settings),
        "workarounds": [d.to_dict() for d in decisions],
        "compile": {"enabled": job.ctx is not None and job.ctx.compile.model,
                    "blocks": compile_per_block(model, bool(config.compile.enable and
                                                            "model" in config.compile.components))},
    }
    return plan
