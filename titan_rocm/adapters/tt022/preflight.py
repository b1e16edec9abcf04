"""The start-up checks TorchTitan 0.2.2 makes before it touches a GPU, made on a login node.

``titan-rocm plan`` calls :func:`check_job` first: it reads the job as the chosen launcher
would (``torchrun -m torchtitan.train``, or titan-rocm's ``python -m titan_rocm.train``,
which adds ``custom_config_module`` and registers titan-rocm's converters itself) and raises
:class:`StartupError` with one sentence for every failure TorchTitan would stop on at
start-up that needs no GPU, in TorchTitan's order where it matters:

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
import dataclasses
import importlib
import os
import subprocess
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from titan_rocm.adapters.common import (  # noqa: F401 - names 0.2.2's callers import here
    DEGREE_NAMES,
    PlanError,
    StartupError,
    WorldSize,
    check_counts,
    check_world_flags,
    degrees,
    world_size,
)
from titan_rocm.adapters.common import one_line as _one_line
from titan_rocm.adapters.tt022.config import CONFIG_MODULE
from titan_rocm.adapters.tt022.job_args import (
    JobArgsError,
    config_module,
    load_toml,
    prepare,
)
from titan_rocm.settings import check_section

LAUNCHERS: tuple[str, ...] = ("torchtitan", "titan-rocm")
"""How the job starts: ``torchrun ... -m torchtitan.train`` (the documented way, default)
or ``torchrun ... -m titan_rocm.train`` / ``titan-rocm-train``."""
DEFAULT_LAUNCHER = "torchtitan"

_LAUNCH_LINES = {
    "torchtitan": "torchrun -m torchtitan.train",
    "titan-rocm": "python -m titan_rocm.train",
}
_IMPORT_FLAGS = ("--experimental.custom_import", "--experimental.custom-import")
_ROCM_PREFIXES = ("--rocm.", "--rocm-")
_BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


@dataclass
class Preflight:
    """A job that passed every start-up check: its config and parallel layout."""

    job_config: Any
    launcher: str
    world: WorldSize
    parallel_dims: Any


# --- 1. the config, as ConfigManager.parse_args reads it -------------------------------------


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of: " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if origin is list:
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" \
            if args else "a list"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _fits(value: Any, tp: Any) -> bool | None:
    """Whether a TOML ``value`` fits annotation ``tp``; None when the type is not checked."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return None
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_fits(value, a) for a in args if a is not type(None)]
        return None if None in verdicts else any(verdicts)
    if origin is list:
        if not isinstance(value, list):
            return False
        return all(_fits(v, args[0]) is not False for v in value) if args else True
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return None


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an extension with unresolvable annotations: take them as written
        return {f.name: f.type for f in dataclasses.fields(cls)}


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)


def check_toml_types(cls: type, table: dict[str, Any], section: str = "") -> None:
    """Check a TOML table against the (merged) JobConfig dataclass ``cls``.

    TorchTitan 0.2.2 rejects unknown keys but hands every other TOML value to the trainer
    unconverted: a string where an integer belongs fails later with a TypeError, and a
    string where a list belongs is iterated letter by letter.

    Raises:
        StartupError: an unknown key, or a value of the wrong type (naming both).
    """
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    where = f"[{section}] " if section else ""
    for key, value in table.items():
        if key not in names:
            raise StartupError(
                f"{where or 'the TOML '}has unknown key {key!r}, so TorchTitan 0.2.2 would stop "
                f"with 'Invalid field names'; accepted keys: {', '.join(names)}"
            )
        tp = hints.get(key)
        name = f"{section}.{key}" if section else key
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise StartupError(
                    f"[{name}] must be a table of settings, got {_type_name(value)} ({value!r})"
                )
            check_toml_types(tp, value, name)
            continue
        if _fits(value, tp) is not False:
            continue
        expected = _describe(tp)
        if isinstance(value, str) and typing.get_origin(tp) is list:
            letters = ", ".join(value[:8]) + (", ..." if len(value) > 8 else "")
            stop = (f" and stop with KeyError: {value[:1]!r} (no converter has that name)"
                    if name == "model.converters" else "")
            raise StartupError(
                f"{where}{key} = {value!r} is a string, but TorchTitan 0.2.2 expects {expected} "
                f"and would read it letter by letter ({letters}){stop}; write "
                f"{key} = [\"{value}\"]"
            )
        if isinstance(value, list) and typing.get_origin(tp) is list:
            bad = next(v for v in value if _fits(v, typing.get_args(tp)[0]) is False)
            raise StartupError(
                f"{where}{key} = {value!r}: {bad!r} is {_type_name(bad)}, but TorchTitan 0.2.2 "
                f"expects {expected}"
            )
        if typing.get_origin(tp) is Literal:
            raise StartupError(f"{where}{key} = {value!r} is not valid; accepted: "
                               + ", ".join(str(a) for a in typing.get_args(tp)))
        raise StartupError(
            f"{where}{key} = {value!r} is {_type_name(value)}, but TorchTitan 0.2.2 expects "
            f"{expected} (it passes TOML values to the trainer unconverted, which would fail "
            "or misread it)"
        )


def bool_flags(cls: type, prefix: str = "") -> set[str]:
    """Dotted names (``rocm.triton_war_strict``) of every boolean field under ``cls``."""
    found: set[str] = set()
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name)
        if dataclasses.is_dataclass(tp):
            found |= bool_flags(tp, f"{prefix}{f.name}.")
        elif tp is bool:
            found.add(f"{prefix}{f.name}")
    return found


def check_bool_flags(args: Sequence[str], flags: set[str]) -> None:
    """Refuse ``--x.flag true`` / ``--x.flag=false``: tyro's boolean flags take no value.

    Raises:
        StartupError: naming the bare forms to write instead.
    """
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        key, sep, inline = arg.partition("=")
        dotted = key[2:].replace("-", "_")
        negated = dotted.split(".")[-1].startswith("no_")
        if negated:
            head, _, last = dotted.rpartition(".")
            dotted = f"{head}.{last[3:]}" if head else last[3:]
        if dotted not in flags:
            continue
        value = inline if sep else (args[i + 1] if i + 1 < len(args) else "")
        if sep or value.lower() in _BOOL_WORDS:
            head, _, last = dotted.rpartition(".")
            raise StartupError(
                f"{key} is a bare flag and takes no value (TorchTitan's parser would stop at "
                f"{value!r}): write --{dotted} for true, --{head}.no-{last} for false"
            )


def _arguments(args: Sequence[str], launcher: str) -> tuple[list[str], dict[str, Any]]:
    """The arguments the launcher hands to ConfigManager, and the job's TOML."""
    try:
        toml = load_toml(args)
        prepared = prepare(args) if launcher == "titan-rocm" else list(args)
    except JobArgsError as exc:
        raise StartupError(str(exc)) from None
    if launcher == "torchtitan":
        module = config_module(prepared, toml)
        rocm_flags = [a.split("=")[0] for a in prepared if a.startswith(_ROCM_PREFIXES)]
        if not module and ("rocm" in toml or rocm_flags):
            used = "a [rocm] section" if "rocm" in toml else f"the flag {rocm_flags[0]}"
            raise StartupError(
                f"the job sets {used} but names no job.custom_config_module, so TorchTitan "
                "0.2.2's parser would reject it: add custom_config_module = "
                f"\"{CONFIG_MODULE}\" under [job] (or --job.custom_config_module "
                f"{CONFIG_MODULE}), or launch with {_LAUNCH_LINES['titan-rocm']} "
                "(plan --launcher titan-rocm)"
            )
        if module == CONFIG_MODULE and "rocm" in toml:
            try:
                check_section(toml["rocm"])
            except ValueError as exc:
                raise StartupError(str(exc)) from None
    return prepared, toml


def _import(name: str) -> Any:
    """Import ``name`` as the launched job would: ``python -m`` (torchrun's way) puts the
    working directory first on ``sys.path``; a console script does not."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def _config_class(manager: Any, args: list[str], toml: dict[str, Any]) -> type:
    """ConfigManager's JobConfig class, merged with the job's custom_config_module."""
    module = config_module(args, toml)
    if module is not None and not isinstance(module, str):
        raise StartupError(
            f"[job] custom_config_module = {module!r} is {_type_name(module)}; expected the "
            f"name of a Python module (e.g. \"{CONFIG_MODULE}\")"
        )
    if module:
        try:
            extension = _import(module)
        except Exception as exc:
            raise StartupError(
                f"job.custom_config_module {module!r} cannot be imported ({_one_line(exc)}); "
                "TorchTitan 0.2.2 imports it while parsing the config"
            ) from None
        if not dataclasses.is_dataclass(getattr(extension, "JobConfig", None)):
            raise StartupError(
                f"job.custom_config_module {module!r} has no JobConfig dataclass, which "
                "TorchTitan 0.2.2 merges into its own"
            )
    return manager._maybe_add_custom_config(args, toml)


@contextlib.contextmanager
def prog_name(name: str) -> Iterator[None]:
    """tyro names ``sys.argv[0]`` in its error box ("For full helptext, run X --help")."""
    saved = sys.argv[0] if sys.argv else None
    if sys.argv:
        sys.argv[0] = name
    else:
        sys.argv.append(name)
    try:
        yield
    finally:
        if saved is None:
            sys.argv.pop(0)
        else:
            sys.argv[0] = saved


def parse_config(args: Sequence[str], launcher: str = DEFAULT_LAUNCHER,
                 prog: str = "titan-rocm plan") -> Any:
    """The JobConfig TorchTitan 0.2.2's ConfigManager makes of ``args`` under ``launcher``.

    Raises:
        StartupError: anything ConfigManager would stop on, or a TOML value of the wrong
            type that it would pass through.
    """
    from torchtitan.config import ConfigManager

    if launcher not in LAUNCHERS:
        raise StartupError(f"unknown launcher {launcher!r}; accepted: {', '.join(LAUNCHERS)}")
    prepared, toml = _arguments(args, launcher)
    manager = ConfigManager()
    cls = _config_class(manager, prepared, toml)
    check_toml_types(cls, toml)
    check_bool_flags(prepared, bool_flags(cls))
    try:
        with prog_name(prog):
            return manager.parse_args(prepared)
    except SystemExit as exc:  # tyro printed its box (which flag, what it accepts) above
        raise StartupError(
            f"TorchTitan's parser rejected the arguments (exit {exc.code}; the box above says "
            f"which); {prog} --help-torchtitan lists every TorchTitan and --rocm.* flag"
        ) from None
    except Exception as exc:
        raise StartupError(f"TorchTitan 0.2.2 would stop reading the config: {_one_line(exc)}"
                           ) from None


# --- 2. Trainer.__init__'s import ---------------------------------------------------------


def check_custom_import(job_config: Any) -> None:
    """Import ``[experimental] custom_import`` as ``Trainer.__init__`` does first thing.

    Raises:
        StartupError: the module cannot be imported.
    """
    name = job_config.experimental.custom_import
    if not name:
        return
    try:
        _import(name)
    except Exception as exc:
        raise StartupError(
            f"[experimental] custom_import = {name!r} cannot be imported ({_one_line(exc)}); "
            "TorchTitan 0.2.2 imports it first thing at start-up"
        ) from None


# --- 3. world size and ParallelDims --------------------------------------------------------

def check_parallelism(d: dict[str, int], world: WorldSize) -> Any:
    """TorchTitan 0.2.2's ``ParallelDims`` for degrees ``d`` (:func:`degrees`) on ``world``,
    with the arithmetic of the device mesh it builds at start-up.

    Raises:
        StartupError: a degree that ParallelDims or its mesh would refuse, with the reason.
    """
    from torchtitan.distributed import ParallelDims

    size = world.size
    given = f"world size {size} ({world.source})"
    for short, value in d.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise StartupError(
                f"[parallelism] {DEGREE_NAMES[short]} = {value!r} is not an integer"
            )
    for short in ("dp_replicate", "cp", "tp", "pp", "ep", "etp"):
        if d[short] < 1:
            raise StartupError(
                f"[parallelism] {DEGREE_NAMES[short]} = {d[short]}, but TorchTitan 0.2.2 "
                "requires every degree to be >= 1 except data_parallel_shard_degree (which "
                "may be -1)"
            )
    if not (d["dp_shard"] == -1 or d["dp_shard"] >= 1):
        raise StartupError(
            f"[parallelism] data_parallel_shard_degree = {d['dp_shard']}, but TorchTitan "
            "0.2.2 accepts -1 (every rank left over) or a degree >= 1"
        )
    fixed = d["dp_replicate"] * d["cp"] * d["tp"] * d["pp"]
    shard = d["dp_shard"]
    if shard == -1:
        shard = size // fixed
        if shard < 1:
            raise StartupError(
                f"data_parallel_shard_degree = -1 leaves {size} // (dp_replicate "
                f"{d['dp_replicate']} x cp {d['cp']} x tp {d['tp']} x pp {d['pp']}) = "
                f"{shard} ranks to shard over on {given}; it needs at least {fixed} ranks"
            )
    if fixed * shard != size:
        raise StartupError(
            f"the degrees do not fit {given}: dp_replicate({d['dp_replicate']}) * "
            f"dp_shard({shard}) * cp({d['cp']}) * tp({d['tp']}) * pp({d['pp']}) = "
            f"{fixed * shard}, and TorchTitan 0.2.2 requires it to equal the world size"
        )
    if d["ep"] > 1 and d["etp"] not in (d["tp"], 1):
        raise StartupError(
            f"expert_tensor_parallel_degree = {d['etp']} with expert parallel "
            f"{d['ep']}: TorchTitan 0.2.2 supports only ETP = TP ({d['tp']}) or ETP = 1"
        )
    dense = shard * d["cp"] * d["tp"]
    experts = d["ep"] * d["etp"]
    if dense % experts:
        raise StartupError(
            f"expert_parallel_degree {d['ep']} x expert_tensor_parallel_degree {d['etp']} = "
            f"{experts} does not divide dp_shard {shard} x cp {d['cp']} x tp {d['tp']} = "
            f"{dense} on {given}, so TorchTitan 0.2.2 cannot build its expert device mesh"
        )
    try:
        return ParallelDims(world_size=size, **d)
    except AssertionError as exc:  # a check of a newer ParallelDims not mirrored above
        raise StartupError(
            f"the degrees do not fit {given}: {_one_line(exc)}"
        ) from None


# --- 4. train spec and batch sizes ----------------------------------------------------------


def check_training(job_config: Any, parallel_dims: Any) -> None:
    """The train spec lookup, pipelining support and batch-size checks of Trainer.__init__.

    Raises:
        StartupError: with TorchTitan's reason.
    """
    from torchtitan.protocols.train_spec import get_train_spec

    try:
        spec = get_train_spec(job_config.model.name)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    if parallel_dims.pp_enabled and not spec.pipelining_fn:
        raise StartupError(
            f"Pipeline Parallel is enabled but {job_config.model.name} does not support "
            "pipelining (TorchTitan 0.2.2)"
        )
    t = job_config.training
    batch_degree = parallel_dims.dp_replicate * parallel_dims.dp_shard
    if t.local_batch_size < 1:
        raise StartupError(f"[training] local_batch_size = {t.local_batch_size}: it must be >= 1")
    global_batch = t.global_batch_size
    if global_batch < 0:
        global_batch = t.local_batch_size * batch_degree
    if global_batch == 0 or global_batch % (t.local_batch_size * batch_degree):
        raise StartupError(
            "global batch size must be multiple of local batch size times data-parallel "
            f"degree ({global_batch} % ({t.local_batch_size} * {batch_degree}) != 0) "
            "(TorchTitan 0.2.2; -1 means local batch size times data-parallel degree)"
        )


# --- 5. model converter names ---------------------------------------------------------------


def _modules_register_titan_rocm(modules: Sequence[str]) -> bool:
    """Whether a fresh interpreter of this environment imports titan_rocm once ``modules``
    are imported, which registers its converters with TorchTitan (a ``sitecustomize`` of
    the environment counts too, as it would in the job)."""
    if any(m.split(".")[0] == "titan_rocm" for m in modules):
        return True
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
            "print('titan_rocm' in sys.modules)")
    try:
        out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True,
                             text=True, timeout=300, check=False, cwd=os.getcwd())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip().endswith("True")


def registered_converters(job_config: Any, launcher: str) -> tuple[str, ...]:
    """The model converter names TorchTitan's registry would hold for this job.

    TorchTitan's own register when ``torchtitan.train`` is imported; the job's
    ``custom_import`` has been imported (:func:`check_custom_import`); titan-rocm's names
    count only when the job imports ``titan_rocm`` (its launcher, ``custom_import`` or
    ``custom_config_module``): this process registers them either way.
    """
    import torchtitan.train  # noqa: F401 - what the launch imports; registers TorchTitan's
    from torchtitan.protocols.model_converter import _registry_model_converter_cls as registry

    ours = titan_rocm_converters()
    names = [n for n in registry if n not in ours]
    if launcher == "titan-rocm":
        return (*names, *sorted(ours))
    if all(c in names for c in job_config.model.converters):
        return tuple(names)  # whether titan_rocm is imported changes nothing
    modules = [m for m in (job_config.job.custom_config_module,
                           job_config.experimental.custom_import) if m]
    if _modules_register_titan_rocm(modules):
        names += sorted(ours)
    return tuple(names)


def check_converters(job_config: Any, registered: Sequence[str]) -> None:
    """Each ``[model] converters`` name must be registered, as ``build_model_converters``
    looks every one up.

    Raises:
        StartupError: naming the first unknown name, TorchTitan's KeyError and the fix.
    """
    known = set(registered)
    ours = titan_rocm_converters()
    for name in job_config.model.converters:
        if name in known:
            continue
        failure = f"TorchTitan 0.2.2 would stop at start-up with KeyError: {name!r}"
        if name in ours:
            raise StartupError(
                f"[model] converters lists {name!r}, titan-rocm's, but the job never imports "
                f"titan_rocm, so {failure}: add custom_import = \"titan_rocm\" under "
                "[experimental] (or --experimental.custom_import titan_rocm), or launch "
                f"with {_LAUNCH_LINES['titan-rocm']} (plan --launcher titan-rocm)"
            )
        hint = ""
        if name == "":
            hint = " (an empty name, from --model.converters \"\" or a stray comma)"
        elif name != name.strip():
            hint = (" (--model.converters splits on commas only, so a space stays in the name: "
                    "write rocm,quantize.linear.float8 without spaces)")
        listing = ", ".join(sorted(known)) or "(none)"
        if not ours <= known:
            listing += f"; titan-rocm's, once the job imports titan_rocm: {', '.join(sorted(ours))}"
        raise StartupError(
            f"[model] converters: {name!r} is not a registered model converter{hint}, so "
            f"{failure}; registered: {listing}"
        )


def check_quantization(job_config: Any) -> None:
    """The GPU-free check every TorchTitan quantization converter makes first: one
    quantization type (float8 or mx) for the whole job. (Building them needs a GPU: they
    ask for its compute capability.)

    Raises:
        StartupError: with TorchTitan's reason.
    """
    if not any("quantize" in c for c in job_config.model.converters):
        return
    from torchtitan.components.quantization import QuantizationConverter

    try:
        QuantizationConverter._validate(job_config)
    except AssertionError as exc:
        raise StartupError(f"{_one_line(exc).removeprefix('AssertionError: ')} "
                           "(TorchTitan 0.2.2)") from None


def titan_rocm_converters() -> set[str]:
    """Names of titan-rocm's converters (registered in this process, whatever the job does)."""
    from torchtitan.protocols.model_converter import _registry_model_converter_cls as registry

    from titan_rocm import register_converters

    register_converters()
    return {n for n, c in registry.items() if c.__module__.startswith("titan_rocm")}


# --- all of it -------------------------------------------------------------------------------


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
