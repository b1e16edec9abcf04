"""What every benchmark shares: runs, launching, logs, storing, re-analysing, the command line.

A benchmark is a module of this package holding its runs and its figures; it runs from the
repository root as ``python -m benchmarks.<name>``. This module is the rest:

- :class:`Run` and :func:`launch`: one TorchTitan training run under torchrun, with fresh or
  shared Inductor/Triton caches and a port of its own; :func:`run_logged`, any command with
  its output in a log; :func:`child_env`, :func:`torchrun` and :func:`fresh_dir` for
  benchmarks that start their own processes;
- :class:`Call`: one call of a benchmark (its logs, environment, results and time budget),
  stored after every run;
- :func:`store_result`, :func:`open_stored`, :func:`stored_runs`: a stored result
  (``summary.json`` + ``logs.tar.gz``) written and read back;
- :func:`parser`, :func:`add_budget`, :func:`require_out`, :func:`print_reanalysis`: the
  standard command line (``--out DIR``, ``--reanalyse DIR``, ``--list``, ``--budget-s``);
- the figures several benchmarks read: :func:`analyse` (one run's log), :func:`stamp`,
  :func:`ratio`, :func:`max_rel_diff`, :func:`tokens_per_step`, :func:`quantile`,
  :func:`report_value`.

Importing it makes nothing on disk: folders and caches are made when a run or call starts.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent

ROCM_ON = ["--rocm.precision_casts", "on", "--rocm.triton_war", "on",
           "--rocm.grouped_mm", "on", "--rocm.moe_eager_compile", "on"]
"""Workarounds whose ``auto`` gate skips off ROCm, forced on so a CUDA run exercises them."""
STOCK = ["--stock"]
"""A :class:`Run` flag, never passed on: the run gets a copy of its config with titan-rocm
taken out (:func:`stock_config`)."""
SKIPPED = "skipped: time budget spent"
"""The exit a run gets that its call's budget left no time for."""


# -- runs -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """One training run of TorchTitan's trainer under torchrun."""

    name: str
    config: str
    """The job's TOML (from the repository root); with :attr:`module`, the name of a config
    function of that module (TorchTitan 0.3.0's ``--config``)."""
    flags: list[str]
    gpus: int = 1
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    expect_failure: bool = False
    timeout: int = 420
    shared_cache: bool = False
    """Use the process's one Inductor/Triton cache (steady-state timing) instead of a cold one."""
    runner: str = "benchmarks.torchtitan_runner"
    """The module torchrun runs: TorchTitan's trainer, observed."""
    module: str | None = None
    """TorchTitan 0.3.0's ``--module`` (the config registry); None: a 0.2.2 TOML job."""

    def describe(self) -> str:
        """The run on one line, as ``--list`` prints it."""
        job = f"--module {self.module} --config {self.config}" if self.module else self.config
        env = "".join(f"{k}={v} " for k, v in self.env.items())
        return f"{self.name}: {self.gpus} GPU(s), {env}{job} {' '.join(self.flags)}"


class _Shared:
    """The process's shared cache and port counter, made or read when first asked for."""

    lock = threading.Lock()
    cache: Path | None = None
    port: int | None = None


def shared_cache() -> Path:
    """The Inductor/Triton cache of every run with ``shared_cache`` in this process."""
    with _Shared.lock:
        if _Shared.cache is None:
            _Shared.cache = Path(tempfile.mkdtemp(prefix="titan-rocm-cache-"))
        return _Shared.cache


def next_port() -> int:
    """A master port no other run of this process took. Two calls sharing a machine (one per
    GPU) each start their own range with ``TITAN_ROCM_BENCH_PORT``."""
    with _Shared.lock:
        if _Shared.port is None:
            _Shared.port = int(os.environ.get("TITAN_ROCM_BENCH_PORT", "29500"))
        _Shared.port += 7
        return _Shared.port


def fresh_dir(name: str) -> Path:
    """A new temporary folder for ``name`` (a run's dump, caches, statistics)."""
    return Path(tempfile.mkdtemp(prefix=re.sub(r"[^\w.-]", "-", name) + "-"))


def child_env(cache: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment for a child: the repository first on ``PYTHONPATH`` (the
    child imports ``titan_rocm`` and ``benchmarks`` from this checkout), unbuffered output,
    with ``cache`` its Inductor and Triton caches, then ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if cache is not None:
        env.update(TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
                   TRITON_CACHE_DIR=str(cache / "triton"))
    env.update(extra)
    return env


def torchrun(gpus: int, *args: str, tee: bool = True) -> list[str]:
    """``torch.distributed.run`` of ``args`` on ``gpus`` processes, on a port of its own; with
    ``tee``, every rank's output in the log, each line prefixed ``[rankN]:``."""
    ranks = ["--local-ranks-filter", ",".join(map(str, range(gpus))), "--role", "rank",
             "--tee", "3"] if tee else []
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={gpus}",
            f"--master_port={next_port()}", *ranks, *args]


def run_logged(cmd: list[str], log: Path, env: dict[str, str], timeout: float | None
               ) -> tuple[int | str, float]:
    """Run ``cmd`` from the repository root, its output (after the command line) in ``log``;
    its exit code (``"timeout"`` when killed after ``timeout`` seconds) and wall seconds."""
    start = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            code: int | str = subprocess.run(cmd, cwd=REPO, env=env, stdout=f,
                                             stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return code, time.monotonic() - start


def launch(run: Run, logs: Path, gpu_ids: Sequence[int] = (0,)) -> dict[str, Any]:
    """Run ``run`` on ``gpu_ids``; its raw result (log path, exit code, wall time, the triton_war
    statistics of every process that compiled)."""
    log = logs / f"{run.name}.log"
    tmp = fresh_dir(run.name)
    # GPU ids count within the GPUs this process was given (a call pinned to GPU 1 of a
    # two-GPU machine with CUDA_VISIBLE_DEVICES=1 runs there, not on GPU 0).
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = given.split(",") if given else [str(i) for i in range(max(gpu_ids) + 1)]
    env = child_env(shared_cache() if run.shared_cache else tmp,
                    CUDA_VISIBLE_DEVICES=",".join(visible[i] for i in gpu_ids),
                    TITAN_ROCM_TRITON_WAR_STATS_DIR=str(tmp / "war-stats"), COUNT_SYNCS="1",
                    **run.env)
    config, flags = run.config, [f for f in run.flags if f not in STOCK]
    if len(flags) < len(run.flags):
        config = str(stock_config(REPO / run.config, tmp))
    job = (["--module", run.module, "--config", config, "--dump_folder", str(tmp / "dump")]
           if run.module else
           ["--job.config_file", config, "--job.dump_folder", str(tmp / "dump")])
    code, wall = run_logged(torchrun(run.gpus, "-m", run.runner, *job, *flags), log, env,
                            run.timeout)
    stats = None
    stats_dir = tmp / "war-stats"
    if stats_dir.is_dir():
        from titan_rocm.workarounds.triton_war import stats as war_stats

        # One file per process that compiled: the trainer and each Inductor compile worker.
        stats = war_stats.collect(stats_dir).to_dict()
        stats["files"] = sorted(p.name for p in stats_dir.iterdir())
    return {"name": run.name, "exit": code, "wall_s": round(wall, 1), "log": str(log),
            "expect_failure": run.expect_failure, "triton_war_stats": stats}


def stock_config(path: Path, tmp: Path) -> Path:
    """A copy of ``path`` without titan-rocm: no converters, no custom import/config, no [rocm].

    TorchTitan 0.2.2's ``--model.converters`` cannot express an empty list on the command line
    (it splits "" into [""]), so the stock run gets its own TOML. Other converters (float8)
    stay.
    """
    out, skip = [], False
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            skip = stripped == "[rocm]"
        if skip or stripped.startswith(("custom_import", "custom_config_module")):
            continue
        if stripped.startswith("converters"):
            listed = ast.literal_eval(stripped.split("=", 1)[1].split("#", 1)[0].strip())
            kept = [c for c in listed if c != "rocm" and not c.startswith("rocm.")]
            line = f"converters = {json.dumps(kept)}"
        out.append(line)
    stock = tmp / f"stock-{path.name}"
    stock.write_text("\n".join(out) + "\n")
    return stock


# -- one call -------------------------------------------------------------------------------


def environment(**extra: Any) -> dict[str, Any]:
    """What a stored result says about the machine and the command that made it."""
    import torch

    try:
        triton = __import__("triton").__version__
    except ImportError:
        triton = None
    gpus = torch.cuda.device_count()
    # The caching allocator's settings change what fits (TorchTitan's run_train.sh sets
    # expandable segments); a run made with them says so.
    alloc = {k: os.environ[k] for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
             if os.environ.get(k)}
    return {"date": datetime.now().isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0) if gpus else None, "gpus": gpus,
            "torch": torch.__version__, "triton": triton, "command": " ".join(sys.argv),
            **({"allocator": alloc} if alloc else {}), **extra}


class Call:
    """One call of a benchmark: its logs folder and environment (made when it starts), its
    results so far, stored after every one (a timeout or a kill keeps what finished), and its
    time budget.

    Args:
        out: where the result is stored (created).
        summarize: the summary to store, from the call as it stands.
        budget_s: seconds the call may take (None: no limit).
        environment: what :func:`environment` records besides its own keys.
    """

    def __init__(self, out: Path, summarize: Callable[[Call], dict[str, Any]],
                 budget_s: float | None = None, **environment_extra: Any) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.summarize = summarize
        self.logs = Path(tempfile.mkdtemp(prefix="titan-rocm-logs-"))
        self.environment = environment(**environment_extra)
        self.results: dict[str, Any] = {}
        self.budget_s = budget_s
        self._start = time.monotonic()
        self._lock = threading.RLock()

    def left_s(self) -> float:
        """Seconds of the budget left (infinite without one)."""
        if self.budget_s is None:
            return math.inf
        return self.budget_s - (time.monotonic() - self._start)

    def store(self) -> dict[str, Any]:
        """Store the summary of the results so far; return it."""
        with self._lock:
            summary = self.summarize(self)
            store_result(self.out, self.logs, summary)
            return summary

    def record(self, name: str, result: dict[str, Any]) -> dict[str, Any]:
        """Keep ``result`` as ``name``'s and store; the stored summary."""
        with self._lock:
            self.results[name] = result
            return self.store()

    def skip_unless(self, name: str, needs_s: float, **result: Any) -> bool:
        """Whether ``needs_s`` seconds are left; if not, ``name`` is recorded as skipped."""
        if self.left_s() >= needs_s:
            return False
        self.record(name, {"name": name, "exit": SKIPPED, **result})
        return True

    def run(self, run: Run, analyse: Callable[[dict[str, Any]], dict[str, Any]],
            gpu_ids: Sequence[int] = (0,), needs_s: float = 60.0) -> None:
        """Launch ``run`` (unless the budget has no ``needs_s`` seconds left for it), analyse
        its log, record it."""
        if self.skip_unless(run.name, needs_s, expect_failure=run.expect_failure):
            return
        raw = launch(run, self.logs, gpu_ids)
        self.record(run.name, analyse(raw))
        print(f"[{run.name}] exit={raw['exit']} wall={raw['wall_s']}s", flush=True)


# -- stored results ---------------------------------------------------------------------------


class StoredResultError(ValueError):
    """A ``--reanalyse`` directory is not a stored result; the message says why."""


def store_result(out: Path, logs: Path, summary: dict[str, Any]) -> None:
    """A stored result, as :func:`open_stored` reads it: ``summary`` as summary.json and the
    ``logs`` folder as logs.tar.gz, each written beside and moved into place (a benchmark
    stores after every run, so a timeout or a kill mid-write keeps the last whole pair)."""
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(out / "summary.json")
    with tarfile.open(out / "logs.tar.gz.tmp", "w:gz") as tar:
        tar.add(logs, arcname="logs")
    (out / "logs.tar.gz.tmp").replace(out / "logs.tar.gz")


@contextlib.contextmanager
def extracted(directory: Path) -> Iterator[Path]:
    """``directory``'s logs.tar.gz extracted into a temporary folder (removed on leaving)."""
    with tempfile.TemporaryDirectory(prefix="titan-rocm-logs-") as tmp:
        with tarfile.open(directory / "logs.tar.gz") as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


@contextlib.contextmanager
def open_stored(directory: Path) -> Iterator[tuple[dict[str, Any], Path]]:
    """A stored result's ``summary.json``, and the folder its ``logs.tar.gz`` is extracted to
    (until the ``with`` ends).

    Raises:
        StoredResultError: either file is missing or unreadable.
    """
    with contextlib.ExitStack() as stack:
        try:
            stored = json.loads((directory / "summary.json").read_text())
            root = stack.enter_context(extracted(directory))
        except (OSError, ValueError, tarfile.TarError) as exc:
            raise StoredResultError(
                f"--reanalyse {directory}: not a stored result ({exc}); accepted: a directory "
                "holding summary.json and logs.tar.gz as a run with --out wrote them") from None
        yield stored, root / "logs"


@contextlib.contextmanager
def stored_runs(directory: Path) -> Iterator[tuple[dict[str, Any], dict[str, dict[str, Any]]]]:
    """A stored result's summary, and each run's raw result as :func:`launch` returned it, its
    log extracted again (runs never started, whose exit says ``skipped...``, are left out)."""
    with open_stored(directory) as (stored, logs):
        raws = {}
        for name, run in stored["runs"].items():
            if str(run.get("exit")).startswith("skipped"):
                continue
            raws[name] = {k: run.get(k) for k in ("name", "exit", "wall_s", "expect_failure",
                                                  "triton_war_stats")}
            raws[name]["log"] = str(logs / f"{name}.log")
        yield stored, raws


# -- the command line -----------------------------------------------------------------------


def parser(doc: str, *, runs: bool = True, reanalyse_many: bool = False
           ) -> argparse.ArgumentParser:
    """A benchmark's command line: ``--reanalyse DIR`` (every figure again from a stored result,
    on any machine) and, for one that runs, ``--out DIR`` and ``--list``."""
    made = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if runs:
        made.add_argument("--out", type=Path, metavar="DIR",
                          help="run, storing summary.json and logs.tar.gz here after every run")
        made.add_argument("--list", action="store_true",
                          help="print the runs --out would make, and exit")
    made.add_argument("--reanalyse", type=Path, metavar="DIR",
                      nargs="+" if reanalyse_many else None,
                      help="recompute the figures of a stored result directory (no GPU)")
    return made


def add_budget(made: argparse.ArgumentParser, default: float | None, what: str) -> None:
    """``--budget-s SECONDS`` (also spelled ``--budget``): the call's time budget."""
    made.add_argument("--budget-s", "--budget", type=float, default=default, dest="budget_s",
                      metavar="SECONDS", help=what)


def require_out(made: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    """``--out``, or the parser's error (exit 2) naming what else is accepted."""
    if not args.out:
        made.error("--out DIR is required (or --reanalyse DIR, or --list)")
    return args.out


def print_reanalysis(made: argparse.ArgumentParser, reanalyse: Callable[..., Any],
                     *args: Any, **kwargs: Any) -> int:
    """Print ``reanalyse(*args, **kwargs)`` as JSON and return 0; a directory that is not a
    stored result is the parser's error (exit 2, the sentence, no traceback)."""
    try:
        figures = reanalyse(*args, **kwargs)
    except StoredResultError as exc:
        made.error(str(exc))
    print(json.dumps(figures, indent=2, default=str))
    return 0


# -- figures ----------------------------------------------------------------------------------

_TS = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
_GUARD_LINE = re.compile(r"divergence guard: (\d+) check\(s\), (\d+) of them waited")
"""The guard's end-of-run line (titan_rocm/workarounds/divergence_guard/monitor.py)."""


def stamp(line: str) -> float | None:
    """The time of a TorchTitan log line (seconds since the epoch), or None."""
    m = _TS.search(line)
    if not m:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def analyse(raw: dict[str, Any]) -> dict[str, Any]:
    """Loss curve, throughput, compile time and reports from one run's log (``raw["log"]``)."""
    from titan_rocm.logs.parse import parse_file

    path = Path(raw["log"])
    text = path.read_text(errors="replace")
    parsed = parse_file(path)
    train = [r for r in parsed.train_records if r.rank in (None, 0)]
    by_step = {r.step: r for r in train}
    starts = [stamp(x) for x in text.splitlines() if "Training starts at step" in x]
    first = [stamp(x) for x in text.splitlines() if re.search(r"\bstep:\s*1\b", x)]
    reports = [json.loads(x.split("TITAN_ROCM_RUN_REPORT ", 1)[1])
               for x in text.splitlines() if "TITAN_ROCM_RUN_REPORT " in x]
    tps = [r.tps for s, r in sorted(by_step.items()) if s > 10 and r.tps]
    return {
        **raw,
        "steps_logged": sorted(by_step),
        "loss": {s: r.loss for s, r in sorted(by_step.items())},
        "grad_norm": {s: r.grad_norm for s, r in sorted(by_step.items())},
        "tps_median": statistics.median(tps) if tps else None,
        "tps_intervals": tps,
        "memory_gib": max((r.memory_gib or 0 for r in train), default=None),
        "to_step1_s": (first[0] - starts[0]) if starts and first and starts[0] and first[0]
        else None,
        "reports": reports,
        "guard_lines": [x.strip()[:400] for x in text.splitlines()
                        if "divergence guard" in x and "diverged" in x][:4],
        "guard_counts": [{"checks": int(m.group(1)), "waited": int(m.group(2))}
                         for m in map(_GUARD_LINE.search, text.splitlines()) if m],
        "titan_rocm_lines": [x.split("titan-rocm:", 1)[1].strip() for x in text.splitlines()
                             if "titan-rocm: rocm." in x][:12],
    }


def report_value(run: dict[str, Any], key: str) -> Any:
    """``key`` of the first ``TITAN_ROCM_RUN_REPORT`` of an analysed run (rank 0's), or None."""
    reports = run.get("reports") or []
    return reports[0].get(key) if reports else None


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 4 decimals; None unless both are there (and non-zero)."""
    return round(a / b, 4) if a and b else None


def max_rel_diff(a: dict[Any, float], b: dict[Any, float], digits: int) -> float | None:
    """The largest ``|a - b| / |b|`` over the keys (steps) both hold, rounded; None if none."""
    rel = [abs(a[s] - b[s]) / abs(b[s]) for s in set(a) & set(b) if b[s]]
    return round(max(rel), digits) if rel else None


def tokens_per_step(config: str) -> int | None:
    """local_batch_size x seq_len of a config (per GPU): tokens/s -> step time."""
    try:
        training = tomllib.loads((REPO / config).read_text())["training"]
        return int(training["local_batch_size"]) * int(training["seq_len"])
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError):
        return None


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``: the nearest-rank element of the sorted list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
