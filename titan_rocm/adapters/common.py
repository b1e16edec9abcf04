"""What both adapters and the CLI share, torch-free (neither adapter imports the other)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import resource
import sys
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_rocm.numbers import MAX_RANKS, RANKS, Bounds

CONFIG_FILE_FLAGS = ("--job.config_file", "--job.config-file")
"""TorchTitan 0.2.2's TOML flag (0.3.0 takes ``--module M --config F`` instead)."""

LAUNCHERS: tuple[str, ...] = ("torchtitan", "titan-rocm")
"""How a 0.2.2 job starts; here because ``plan --launcher`` lists them before TorchTitan is
found."""
DEFAULT_LAUNCHER = "torchtitan"


class StartupError(ValueError):
    """The job would stop at start-up; the message says why, in one sentence, and the fix."""


class PlanError(StartupError):
    """The job cannot be planned (either TorchTitan generation); the message says why."""


@dataclass(frozen=True)
class WorldSize:
    """The number of ranks a plan assumes, and where that number came from."""
    size: int
    source: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return dataclasses.asdict(self)


class JobArgsError(ValueError):
    """The job's arguments or TOML file cannot be used; the message says why."""


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (the sentence every refusal ends with)."""
    if exc.args and all(isinstance(a, str) for a in exc.args):
        text = " ".join(a.strip() for a in exc.args)
    else:
        text = str(exc)
    text = " ".join(text.split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- the world size a plan assumes ----------------------------------------------------

DEGREE_NAMES = {
    "dp_replicate": "data_parallel_replicate_degree",
    "dp_shard": "data_parallel_shard_degree",
    "cp": "context_parallel_degree",
    "tp": "tensor_parallel_degree",
    "pp": "pipeline_parallel_degree",
    "ep": "expert_parallel_degree",
    "etp": "expert_tensor_parallel_degree",
}


DEGREES: dict[str, Bounds] = {
    short: Bounds(int, 1, MAX_RANKS, also=(-1,) if short == "dp_shard" else ())
    for short in DEGREE_NAMES
}
"""What TorchTitan's ``ParallelDims._validate`` accepts
(``torchtitan/distributed/parallel_dims.py``)."""


def check_degrees(d: dict[str, Any]) -> None:
    """Each degree in ``d`` is an integer :data:`DEGREES` accepts; else StartupError."""
    for short, value in d.items():
        try:
            DEGREES[short].check(value, f"[parallelism] {DEGREE_NAMES[short]} =")
        except ValueError as exc:
            raise StartupError(str(exc)) from None


def degrees(job_config: Any) -> dict[str, int]:
    """The job's parallel degrees (1 for a degree its TorchTitan has no field for)."""
    p = job_config.parallelism
    return {short: getattr(p, long, 1) for short, long in DEGREE_NAMES.items()}


def check_counts(size: int | None, nnodes: int | None, nproc_per_node: int | None) -> None:
    """Each world-size flag given is a rank count (``numbers.RANKS``); else StartupError."""
    for value, flag in ((size, "--world-size"), (nnodes, "--nnodes"),
                        (nproc_per_node, "--nproc-per-node")):
        if value is not None:
            try:
                RANKS.parse(value, flag)
            except ValueError as exc:
                raise StartupError(str(exc)) from None


def check_world_flags(size: int | None, nnodes: int | None, nproc_per_node: int | None) -> None:
    """The world-size flags alone, torch-free so plan refuses them at once (StartupError)."""
    check_counts(size, nnodes, nproc_per_node)
    if nnodes is not None or nproc_per_node is not None:
        nodes, per_node = nnodes or 1, nproc_per_node or 1
        if size is not None and size != nodes * per_node:
            raise StartupError(
                f"--world-size {size} disagrees with --nnodes {nodes} x --nproc-per-node "
                f"{per_node} = {nodes * per_node}; give one or the other"
            )


def world_size(
    d: dict[str, int],
    size: int | None = None,
    nnodes: int | None = None,
    nproc_per_node: int | None = None,
) -> WorldSize:
    """``size``, else ``nnodes * nproc_per_node``, else the smallest the degrees fit.

    Raises StartupError for a count or degree out of range (10**20 would make the mesh
    arithmetic run for ever) or disagreeing world-size flags.
    """
    check_world_flags(size, nnodes, nproc_per_node)
    check_degrees(d)
    if nnodes is not None or nproc_per_node is not None:
        nodes, per_node = nnodes or 1, nproc_per_node or 1
        product = nodes * per_node
        return WorldSize(
            product, "--nnodes x --nproc-per-node",
            f"{nodes} node(s) x {per_node} process(es) per node, as torchrun would start",
        )
    if size is not None:
        return WorldSize(size, "--world-size", f"{size} rank(s), given with --world-size")
    shard, note = d["dp_shard"], ""
    if shard < 1:
        # dp_shard = -1 takes every rank left over; the smallest world leaves it the least
        # that keeps the expert mesh whole (EP x ETP must divide dp_shard x cp x tp).
        experts = max(d["ep"], 1) * max(d["etp"], 1)
        shard = experts // math.gcd(experts, max(d["cp"] * d["tp"], 1))
        note = (f" (data_parallel_shard_degree = -1 taken at its smallest, {shard}"
                + (f", that expert parallel {d['ep']} x ETP {d['etp']} fits" if shard > 1 else "")
                + ")")
    size = d["dp_replicate"] * shard * d["cp"] * d["tp"] * d["pp"]
    how = (f"dp_replicate {d['dp_replicate']} x dp_shard {shard} x cp {d['cp']} x tp {d['tp']} "
           f"x pp {d['pp']}{note}")
    return WorldSize(
        size, "derived",
        f"{size} = {how}; no --world-size or --nnodes/--nproc-per-node was given, and the "
        "plan (FSDP or not, which kernels) can change with the real number of ranks",
    )


# --- flags read without torch ----------------------------------------------------------

def flag_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The first of ``names`` in ``args``, read as TorchTitan 0.2.2 does (first occurrence).

    By hand because TorchTitan's ``ConfigManager`` imports torch (10-20 s on a login node).
    """
    for i, arg in enumerate(args):
        key, sep, value = arg.partition("=")
        if key in names:
            if sep:
                return value
            if i + 1 < len(args):
                return args[i + 1]
            raise JobArgsError(f"{key} needs a value")
    return None


def module_and_config(args: Sequence[str]) -> tuple[str | None, str | None]:
    """``--module`` and ``--config`` as 0.3.0's ``ConfigManager`` reads them (last wins); None if
    absent."""
    found: dict[str, str | None] = {"--module": None, "--config": None}
    i = 0
    while i < len(args):
        key, sep, value = args[i].partition("=")
        if key in found:
            if sep:
                found[key] = value
            elif i + 1 < len(args):
                found[key] = args[i + 1]
                i += 1
        i += 1
    return found["--module"], found["--config"]


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


class LaunchError(ValueError):
    """The process environment is neither torchrun's nor a plain single process."""


def single_process_environment(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Give a process started without torchrun the environment of torchrun's only worker.

    Returns what it set; raises LaunchError when only some of RANK, LOCAL_RANK, WORLD_SIZE are set.
    """
    present = [v for v in RANK_VARIABLES if v in environ]
    if present:
        missing = [v for v in RANK_VARIABLES if v not in environ]
        if missing:
            raise LaunchError(
                f"{', '.join(f'{v}={environ[v]}' for v in present)} set but "
                f"{', '.join(missing)} not: start the job with torchrun (which sets all of "
                "them), or unset them for a single process"
            )
        return {}
    host = environ.get("MASTER_ADDR", "127.0.0.1")
    wanted = {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "0",
        "ROLE_WORLD_SIZE": "1", "ROLE_NAME": "default", "MASTER_ADDR": host,
    }
    # Port 0: the only rank's store binds a port the OS picks as it listens, and no other
    # rank connects. A port chosen free beforehand can be taken by another process before the
    # store binds it (EADDRINUSE, seen with test runs side by side).
    wanted["MASTER_PORT"] = "0"
    added = {k: v for k, v in wanted.items() if k not in environ}
    environ.update(added)
    return added


class CpuMemoryMonitor:
    """Stand-in for TorchTitan's CUDA ``DeviceMemoryMonitor`` on a CPU trainer: peak RSS."""

    device_name = "CPU (titan-rocm CPU trainer)"
    device_capacity_gib = 0.0

    def get_peak_stats(self) -> Any:
        from torchtitan.components.metrics import DeviceMemStats  # both generations'

        gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB -> GiB
        return DeviceMemStats(gib, 0.0, gib, 0.0, 0, 0)

    def reset_peak_stats(self) -> None:
        """Peak RSS cannot be reset; nothing to do."""


@dataclass(frozen=True)
class PlanRequest:
    """What ``titan-rocm plan`` asks of the installed generation's adapter."""

    args: list[str]
    arch: str | None = None
    world_size: int | None = None
    nnodes: int | None = None
    nproc_per_node: int | None = None
    launcher: str = DEFAULT_LAUNCHER
    """0.2.2's (:data:`LAUNCHERS`); 0.3.0's plan reads the job's config instead."""
    aiter: str | None = None
    primus_turbo: str | None = None


@dataclass(frozen=True)
class AuditRequest:
    """What ``titan-rocm audit`` asks of the installed generation's adapter."""

    passthrough: list[str]
    config_file: str | None = None
    trainer: str | None = None
    tokens: int | None = None
    chunks: int | None = None
    before_job: Callable[[list[Any]], None] | None = field(default=None, compare=False)
    """Called with the built model parts before the job pass (the CLI installs the test fault
    there)."""


@dataclass(frozen=True)
class CollectRequest:
    """What ``titan-rocm tune collect`` asks of the installed generation's adapter."""

    passthrough: list[str]
    output: Path
    trainer: str | None = None


def one_process(command: str) -> None:
    """:func:`single_process_environment`, said once on stderr as ``command`` (LaunchError)."""
    added = single_process_environment()
    if added:
        print(f"{command}: no torchrun environment: one process (RANK=0, WORLD_SIZE=1, "
              f"MASTER_PORT={os.environ['MASTER_PORT']}: the OS picks the port), as torchrun "
              "--standalone --nproc_per_node=1 would start it", file=sys.stderr)


def build_trainer(build: Callable[[], Any], no_gpu_hint: str = "") -> Any:
    """``build()``; a failure says where to audit when this machine has no GPU (StartupError)."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - any failure of the job's start-up is reported
        where = ""
        try:
            import torch

            if not torch.cuda.is_available():
                where = (" (this machine has no GPU, and the audit builds the job's own "
                         "trainer: run titan-rocm audit where the job trains, e.g. "
                         f"torchrun --nproc_per_node=N -m titan_rocm.cli audit ...{no_gpu_hint})")
        except ImportError:
            pass
        raise StartupError(f"the job cannot start: {one_line(exc)}{where}") from None


def first_batch(trainer: Any) -> tuple[Any, Any]:
    """The first micro-batch of the trainer's dataloader (StartupError when it gives none)."""
    try:
        return next(iter(trainer.dataloader))
    except Exception as exc:  # noqa: BLE001
        raise StartupError(f"the job's dataloader gave no batch: {one_line(exc)}") from None


def switch_off(config: Any, keys: Sequence[tuple[str, str]]) -> None:
    """Set each bool ``(section, key)`` of a job's config to False; others are left alone."""
    for section, key in keys:
        obj = getattr(config, section, None)
        if obj is not None and isinstance(getattr(obj, key, None), bool):
            setattr(obj, key, False)


def audit_job(request: AuditRequest, build: Callable[[], Any], settings: Any,
              audit_built: Callable[..., Any], no_gpu_hint: str = "") -> Any:
    """``audit``'s first half for either generation (AuditError when the job cannot start)."""
    from titan_rocm.numerics.audit import refuse_unsupported
    from titan_rocm.numerics.result import AuditError

    try:
        single_process_environment()
        trainer = build_trainer(build, no_gpu_hint)
        refuse_unsupported(getattr(trainer, "parallel_dims", None))
        input_dict, labels = first_batch(trainer)
    except (LaunchError, StartupError) as exc:
        raise AuditError(str(exc)) from None
    if request.before_job is not None:
        request.before_job(trainer.model_parts)
    return audit_built(trainer, settings, input_dict, labels, request.tokens, request.chunks)


def audit_built_with(trainer: Any, settings: Any, input_dict: Any, labels: Any,
                     tokens: int | None = None, chunks: int | None = None, *,
                     job: Callable[[Any], Any], kit: Callable[[Any, Any], Any]) -> Any:
    """Audit one micro-batch of a built trainer; separate so tests and benchmarks reuse one
    trainer."""
    import torch

    from titan_rocm.numerics.audit import audit_micro_batch
    from titan_rocm.numerics.stats import AuditSettings

    found = job(trainer)
    facts = found.audit_facts(trainer.model_parts) if found is not None else None
    return audit_micro_batch(
        trainer.model_parts, torch.device(getattr(trainer, "device", "cpu")),
        lambda labels: kit(trainer, labels), input_dict, labels,
        AuditSettings.of(settings), facts, tokens, chunks, settings.numerics_audit_reference,
        settings.numerics_audit_submodules)


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
