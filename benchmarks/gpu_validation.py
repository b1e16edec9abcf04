"""Validate titan-rocm inside TorchTitan 0.2.2's real trainer on GPUs, and measure what it costs.

One command on a GPU box (run from the repository root, titan-rocm importable):

    python benchmarks/gpu_validation.py --suite single --out results/     # 1-2 GPUs
    python benchmarks/gpu_validation.py --suite dual --out results/       # needs 2 GPUs
    python benchmarks/gpu_validation.py --suite throughput --models llama3_1b,qwen3_1.7b \
        --steps 60 --out results/                                        # 1 GPU, ratios
    python benchmarks/gpu_validation.py --suite fp8 --steps 30 --out results/   # torchao 0.16
    python benchmarks/gpu_validation.py --suite throughput --models deepseek_v3_4b \
        --steps 30 --out results/                     # 1 GPU: MoE scopes side by side
    python benchmarks/gpu_validation.py --suite throughput --models llama3_1b_guard \
        --steps 40 --out results/                     # 1 GPU: divergence guard modes
    python benchmarks/gpu_validation.py --suite throughput --models deepseek_v3_4b_memory \
        --steps 30 --out results/                     # 1 GPU: capture_scalar_outputs, bf16
                                                      # MoE combine: peak memory, speed
    python benchmarks/gpu_validation.py --suite moe_graphs --steps 20 --out results/
                                                      # 2 GPUs: FSDP + EP=2, graphs audited

``moe_graphs`` runs deepseek_v3 with FSDP 2 x EP 2 under each MoE compile (``moe`` scope,
``block`` scope, stock MoE compile) with ``TITAN_ROCM_RECORD_GRAPHS=1``: the trainer compiles
through a backend that audits every graph Dynamo makes before Inductor compiles it, and the
figures say, per rank, whether any graph held a collective, an FSDP op or MoE routing.

``single`` runs the debug configs with ``converters = ["rocm"]`` (workarounds forced ``on``
where ``auto`` would skip on CUDA) and with no converter, same seed and data; pairs that are
compared run one after the other on the same GPU (two GPUs: two lanes in parallel, each with
its own pairs). ``dual`` runs the two-GPU cases (FSDP NaN stop, deepseek_v3 EP=2 + FSDP).
Every run uses fresh Inductor/Triton cache directories, so compile times are cold and every
kernel compile goes through Triton. ``throughput`` runs each variant of a model twice in mirrored
order (A B C ... C B A) with one shared compile cache and reports pooled medians and per-pass
ratios; ``llama3_1b`` and ``qwen3_1.7b`` are GPU-bound sizes (``benchmarks/bench_flavors.py``),
the debug models are host-bound on an H200 and too noisy for a 1% ratio. ``fp8`` runs the FP8
debug config stock vs rocm. It prints a table of ratios and writes ``summary.json``,
``summary.md`` and ``logs.tar.gz`` to ``--out``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from titan_rocm.logs.parse import parse_file  # noqa: E402

# Workarounds whose auto gate skips off ROCm, forced on so the CUDA run exercises them.
ROCM_ON = [
    "--rocm.precision_casts", "on", "--rocm.triton_war", "on",
    "--rocm.grouped_mm", "on", "--rocm.moe_eager_compile", "on",
    # Named, not left to the default (it was "moe" for a while): runs stay comparable across time.
    "--rocm.moe_eager_scope", "block",
]
STOCK = ["--stock"]  # marker: run a copy of the config with titan-rocm taken out
SEED = ["--debug.seed", "42"]
LOG10 = ["--metrics.log_freq", "10"]


@dataclasses.dataclass
class Run:
    """One training run."""

    name: str
    config: str
    flags: list[str]
    gpus: int = 1
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    expect_failure: bool = False
    timeout: int = 420
    shared_cache: bool = False
    """Use the suite's Inductor/Triton cache (steady-state timing) instead of a cold one."""
    runner: str = "torchtitan_runner.py"
    """The module under benchmarks/ that runs TorchTitan's trainer."""


def single_suite(steps: int) -> tuple[list[Run], list[Run]]:
    """Two lanes of one-GPU runs (compared pairs share a lane)."""
    s = ["--training.steps", str(steps)]

    def run(name: str, model: str, *flags: str, **kw: Any) -> Run:
        return Run(name, f"configs/{model}_debug.toml", [*s, *SEED, *LOG10, *flags], **kw)

    lane0 = [
        run("llama3_stock", "llama3", *STOCK),
        run("llama3_rocm", "llama3", *ROCM_ON),
        run("llama3_rocm_nowar", "llama3", *ROCM_ON, "--rocm.triton_war", "off"),
        run("llama3_rocm_guard_off", "llama3", *ROCM_ON, "--rocm.divergence_guard", "off"),
        run("llama3_rocm_every_step", "llama3", *ROCM_ON, "--rocm.divergence_check",
            "every_step"),
        run("llama3_nan_step7", "llama3", *ROCM_ON,
            env={"TITAN_ROCM_DEBUG_INJECT_NAN_STEP": "7"}, expect_failure=True),
        run("qwen3_stock", "qwen3", *STOCK),
        run("qwen3_rocm", "qwen3", *ROCM_ON),
    ]
    lane1 = [
        run("deepseek_v3_stock", "deepseek_v3", *STOCK),
        run("deepseek_v3_rocm", "deepseek_v3", *ROCM_ON),
        run("deepseek_v3_rocm_loop", "deepseek_v3", *ROCM_ON, "--rocm.grouped_mm_backend",
            "loop"),
        run("deepseek_v3_rocm_stock_moe_compile", "deepseek_v3", *ROCM_ON,
            "--rocm.moe_eager_compile", "off"),
    ]
    return lane0, lane1


# Throughput: every variant of a model runs twice, in mirrored order (A B C ... C B A), so a
# linear drift of the machine hits every variant alike; medians pool both runs' intervals.
GUARD_VARIANTS = [
    ("rocm_on_guard_off", [*ROCM_ON, "--rocm.divergence_guard", "off"]),
    ("rocm_on_every_step", [*ROCM_ON, "--rocm.divergence_check", "every_step"]),
]
STOCK_MOE_COMPILE = [*ROCM_ON, "--rocm.moe_eager_compile", "off"]
MOE_SCOPE = [*ROCM_ON, "--rocm.moe_eager_scope", "moe"]
MOE_SCOPE_TARGET = 0.98
"""Issue 16's target for ``moe_eager_scope = "moe"``: tokens/s at least this fraction of stock."""
EVERY_STEP_VARIANTS = [
    ("rocm_on_every_step", [*ROCM_ON, "--rocm.divergence_check", "every_step"]),
    ("rocm_on_every_step_exact", [*ROCM_ON, "--rocm.divergence_check", "every_step_exact"]),
]
GUARD_TARGET = 0.99
"""Issue 16's target for ``divergence_check = "every_step"``: tokens/s over guard off."""


@dataclasses.dataclass(frozen=True)
class ThroughputModel:
    """One model of the throughput suite: its config and the variants compared on it."""

    config: str
    variants: list[tuple[str, list[str]]]
    """(name, flags) pairs, the baseline first: "stock", which every ``*_over_stock`` ratio
    divides by, or (a model without a stock run) its :attr:`also_over` variant."""
    flags: list[str] = dataclasses.field(default_factory=list)
    """Flags every variant gets (e.g. the flavor)."""
    bench_flavors: bool = False
    """Needs ``benchmarks/bench_flavors.py`` (a flavor TorchTitan 0.2.2 does not ship)."""
    also_over: str | None = None
    """A second baseline: every other variant also gets its ratio over this one."""
    variant_env: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    """Environment a variant's runs get on top of the suite's (by variant name)."""


THROUGHPUT: dict[str, ThroughputModel] = {
    # Debug models: host-bound on an H200 (see benchmarks/bench_flavors.py).
    "llama3": ThroughputModel("configs/llama3_debug.toml", [
        ("stock", STOCK),
        ("rocm", []),  # what a user gets on this GPU: auto gates decide
        ("rocm_on", ROCM_ON),  # every workaround forced on (guard in its default mode)
        *GUARD_VARIANTS,
    ]),
    "qwen3": ThroughputModel("configs/qwen3_debug.toml",
                             [("stock", STOCK), ("rocm", []), ("rocm_on", ROCM_ON)]),
    "deepseek_v3": ThroughputModel("configs/deepseek_v3_debug.toml", [
        ("stock", STOCK),
        ("rocm_on", ROCM_ON),  # mixed compile: MoE blocks eager
        ("rocm_on_stock_moe_compile", STOCK_MOE_COMPILE),
    ]),
    # GPU-bound sizes: the step is GPU time, so a 1% cost is measurable.
    "llama3_1b": ThroughputModel(
        "configs/llama3_debug.toml", [("stock", STOCK), ("rocm_on", ROCM_ON), *GUARD_VARIANTS],
        ["--model.flavor", "bench_1B"], bench_flavors=True),
    "qwen3_1.7b": ThroughputModel("configs/qwen3_debug.toml",
                                  [("stock", STOCK), ("rocm_on", ROCM_ON)],
                                  ["--model.flavor", "1.7B"]),
    "deepseek_v3_4b": ThroughputModel(
        "configs/deepseek_v3_debug.toml",
        [("stock", STOCK),
         ("rocm_on", ROCM_ON),  # moe_eager_scope = "block": the whole MoE block eager
         ("rocm_on_moe_scope", MOE_SCOPE),  # attention and norms compiled, MoE module eager
         ("rocm_on_stock_moe_compile", STOCK_MOE_COMPILE)],
        ["--model.flavor", "bench_moe_4B"], bench_flavors=True),
    # The divergence guard's modes side by side with the guard off, their baseline (no stock
    # run: 8 runs of a GPU-bound 1.5B fit in one 9-minute call).
    "llama3_1b_guard": ThroughputModel(
        "configs/llama3_debug.toml",
        [("rocm_on_guard_off", [*ROCM_ON, "--rocm.divergence_guard", "off"]),
         ("rocm_on", ROCM_ON), *EVERY_STEP_VARIANTS],
        ["--model.flavor", "bench_1B"], bench_flavors=True, also_over="rocm_on_guard_off"),
    # Where rocm_on_stock_moe_compile's cost against stock goes: each forced-on workaround
    # taken out of it in turn (triton_war is left in: on CUDA it only wraps compiles).
    "deepseek_v3_4b_parts": ThroughputModel(
        "configs/deepseek_v3_debug.toml",
        [("stock", STOCK), ("rocm_on_stock_moe_compile", STOCK_MOE_COMPILE),
         ("without_precision_casts", [*STOCK_MOE_COMPILE, "--rocm.precision_casts", "off"]),
         ("without_grouped_mm", [*STOCK_MOE_COMPILE, "--rocm.grouped_mm", "off"]),
         ("without_guard", [*STOCK_MOE_COMPILE, "--rocm.divergence_guard", "off"])],
        ["--model.flavor", "bench_moe_4B"], bench_flavors=True,
        also_over="rocm_on_stock_moe_compile"),
    # Issue 22, item 3: peak memory and speed of the mixed compile with Dynamo's
    # capture_scalar_outputs as TorchTitan leaves it (titan-rocm no longer forces it) vs
    # forced on (what titan-rocm did), and with AMD-AGI/Primus's bf16 MoE combine.
    "deepseek_v3_4b_memory": ThroughputModel(
        "configs/deepseek_v3_debug.toml",
        [("rocm_on", ROCM_ON),
         ("rocm_on_capture_scalars", ROCM_ON),
         ("rocm_on_bf16_combine", [*ROCM_ON, "--rocm.moe_combine", "bf16"])],
        ["--model.flavor", "bench_moe_4B"], bench_flavors=True, also_over="rocm_on",
        variant_env={"rocm_on_capture_scalars": {"TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS": "1"}}),
}


def throughput_suite(steps: int, models: list[str]) -> list[Run]:
    """Mirrored runs per model on one GPU; one compile cache per suite (warm after the first)."""
    s = ["--training.steps", str(steps), *SEED, *LOG10]
    runs = []
    for model in models:
        spec = THROUGHPUT[model]
        variants = spec.variants
        for i, (variant, flags) in enumerate([*variants, *reversed(variants)]):
            extra = []
            if spec.bench_flavors:  # one custom import: the flavors, plus titan-rocm unless stock
                module = "benchmarks.bench_flavors" + ("" if variant == "stock" else "_rocm")
                extra = ["--experimental.custom_import", module]
            runs.append(Run(f"{model}_{variant}@{1 if i < len(variants) else 2}", spec.config,
                            [*s, *spec.flags, *extra, *flags], shared_cache=True,
                            env=dict(spec.variant_env.get(variant, {}))))
    return runs


def fp8_suite(steps: int) -> list[Run]:
    """The FP8 debug config (torchao float8 linear + grouped-MM converters), stock vs rocm."""
    s = ["--training.steps", str(steps), *SEED, *LOG10]
    config = "configs/deepseek_v3_debug_fp8.toml"
    return [Run("deepseek_v3_fp8_stock", config, [*s, *STOCK]),
            Run("deepseek_v3_fp8_rocm", config, [*s, *ROCM_ON])]


RECORD = {"TITAN_ROCM_RECORD_GRAPHS": "1"}
RECORD_BACKEND = ["--compile.backend", "titan_rocm_record_inductor"]  # torchtitan_runner.py
EP2_FSDP2 = ["--parallelism.expert_parallel_degree", "2",
             "--parallelism.data_parallel_shard_degree", "2"]
GRAPH_RUNS = {
    # name: (flags, whether the audit must find every graph clean)
    "deepseek_v3_ep2_fsdp2_moe_scope_graphs": (MOE_SCOPE, True),
    "deepseek_v3_ep2_fsdp2_block_scope_graphs": (ROCM_ON, True),
    # Positive control: stock MoE compile puts the router, permutation and grouped GEMM in
    # graphs, so an audit that sees nothing there is blind.
    "deepseek_v3_ep2_fsdp2_stock_moe_compile_graphs": (STOCK_MOE_COMPILE, False),
}


def moe_graphs_suite(steps: int) -> list[Run]:
    """Two GPUs, FSDP 2 x EP 2, deepseek_v3 debug: every compiled graph audited, per scope."""
    s = ["--training.steps", str(steps), *SEED, *LOG10]
    return [Run(name, "configs/deepseek_v3_debug.toml", [*s, *flags, *EP2_FSDP2, *RECORD_BACKEND],
                gpus=2, env=dict(RECORD), timeout=300)
            for name, (flags, _) in GRAPH_RUNS.items()]


def dual_suite(steps: int) -> list[Run]:
    """Two-GPU runs, one after the other."""
    s = ["--training.steps", str(steps), *SEED, *LOG10]
    return [
        Run("llama3_fsdp2_nan_step7", "configs/llama3_debug.toml", [*s, *ROCM_ON], gpus=2,
            env={"TITAN_ROCM_DEBUG_INJECT_NAN_STEP": "7", "TITAN_ROCM_DEBUG_INJECT_NAN_RANK": "1"},
            expect_failure=True, timeout=300),
        Run("deepseek_v3_ep2_fsdp2_rocm", "configs/deepseek_v3_debug.toml",
            [*s, *ROCM_ON, "--parallelism.expert_parallel_degree", "2",
             "--parallelism.data_parallel_shard_degree", "2"], gpus=2),
    ]


_SHARED_CACHE = Path(tempfile.mkdtemp(prefix="titan-rocm-cache-"))
# Two suites may share a machine (one per GPU): each takes its own port range.
_PORT = [int(os.environ.get("TITAN_ROCM_BENCH_PORT", "29500"))]
_PORT_LOCK = threading.Lock()


def _port() -> int:
    with _PORT_LOCK:
        _PORT[0] += 7
        return _PORT[0]


def run_logged(cmd: list[str], log: Path, env: dict[str, str], timeout: float
               ) -> tuple[int | str, float]:
    """Run ``cmd`` from the repository root, its output (after the command line) in ``log``;
    its exit code (``"timeout"`` when killed) and wall seconds."""
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


def launch(run: Run, out: Path, gpu_ids: list[int]) -> dict[str, Any]:
    """Run ``run`` on ``gpu_ids``; return its raw result (log path, exit code, wall time)."""
    log = out / f"{run.name}.log"
    tmp = Path(tempfile.mkdtemp(prefix=f"{run.name}-"))
    cache = _SHARED_CACHE if run.shared_cache else tmp
    env = dict(os.environ)
    # Lane GPU ids count within the GPUs this process was given (a suite pinned to GPU 1
    # of a two-GPU machine with CUDA_VISIBLE_DEVICES=1 runs there, not on GPU 0).
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = given.split(",") if given else [str(i) for i in range(max(gpu_ids) + 1)]
    env.update(
        CUDA_VISIBLE_DEVICES=",".join(visible[i] for i in gpu_ids),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        TRITON_CACHE_DIR=str(cache / "triton"),
        TITAN_ROCM_TRITON_WAR_STATS_DIR=str(tmp / "war-stats"),
        COUNT_SYNCS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(run.env)
    config, flags = run.config, list(run.flags)
    if "--stock" in flags:
        flags.remove("--stock")
        config = str(stock_config(REPO / run.config, tmp))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={run.gpus}",
        f"--master_port={_port()}", "--local-ranks-filter", ",".join(map(str, range(run.gpus))),
        "--role", "rank", "--tee", "3",
        str(REPO / "benchmarks" / run.runner),
        "--job.config_file", config, "--job.dump_folder", str(tmp / "dump"), *flags,
    ]
    code, wall = run_logged(cmd, log, env, run.timeout)
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


_TS = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
_GUARD_LINE = re.compile(r"divergence guard: (\d+) check\(s\), (\d+) of them waited")
"""The guard's end-of-run line (titan_rocm/workarounds/divergence_guard/monitor.py)."""


def _stamp(line: str) -> float | None:
    m = _TS.search(line)
    if not m:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def analyse(raw: dict[str, Any]) -> dict[str, Any]:
    """Loss curve, throughput, compile time and reports from one run's log."""
    path = Path(raw["log"])
    text = path.read_text(errors="replace")
    parsed = parse_file(path)
    train = [r for r in parsed.train_records if r.rank in (None, 0)]
    by_step = {r.step: r for r in train}
    starts = [_stamp(x) for x in text.splitlines() if "Training starts at step" in x]
    first = [_stamp(x) for x in text.splitlines() if re.search(r"\bstep:\s*1\b", x)]
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


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def _spread(run: dict[str, Any]) -> tuple[float, float] | None:
    values = run.get("tps_intervals") or []
    return (min(values), max(values)) if values else None


def compare(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures issue 7 asks for."""
    out: dict[str, Any] = {}
    for model in ("llama3", "qwen3", "deepseek_v3", "deepseek_v3_fp8"):
        stock, rocm = results.get(f"{model}_stock"), results.get(f"{model}_rocm")
        if not stock or not rocm:
            continue
        common = sorted(set(stock["loss"]) & set(rocm["loss"]))
        rel = [abs(rocm["loss"][s] - stock["loss"][s]) / abs(stock["loss"][s]) for s in common
               if stock["loss"][s]]
        out[model] = {
            "tps_ratio_rocm_over_stock": _ratio(rocm["tps_median"], stock["tps_median"]),
            # Per-interval spread (min, max): how far apart one run's own intervals are.
            "tps_spread_stock": _spread(stock),
            "tps_spread_rocm": _spread(rocm),
            "loss_max_rel_diff": round(max(rel), 5) if rel else None,
            "loss_step1": (stock["loss"].get(1), rocm["loss"].get(1)),
            "loss_last": (stock["loss"].get(common[-1]) if common else None,
                          rocm["loss"].get(common[-1]) if common else None),
            "to_step1_s": (stock["to_step1_s"], rocm["to_step1_s"]),
            "memory_gib": (stock["memory_gib"], rocm["memory_gib"]),
        }
    r = results
    if "llama3_rocm" in r and "llama3_rocm_guard_off" in r:
        syncs = {k: _syncs(r[k])
                 for k in ("llama3_rocm_guard_off", "llama3_rocm", "llama3_rocm_every_step")
                 if k in r}
        out["divergence_guard"] = {
            "tps_ratio_default_over_off": _ratio(r["llama3_rocm"]["tps_median"],
                                                 r["llama3_rocm_guard_off"]["tps_median"]),
            "tps_ratio_every_step_over_off": _ratio(
                r.get("llama3_rocm_every_step", {}).get("tps_median"),
                r["llama3_rocm_guard_off"]["tps_median"]),
            "host_syncs_whole_run": syncs,
        }
    if "llama3_rocm" in r and "llama3_rocm_nowar" in r:
        out["triton_war_compile"] = {
            "to_step1_s_with": r["llama3_rocm"]["to_step1_s"],
            "to_step1_s_without": r["llama3_rocm_nowar"]["to_step1_s"],
            "ratio_with_over_without": _ratio(r["llama3_rocm"]["to_step1_s"],
                                              r["llama3_rocm_nowar"]["to_step1_s"]),
            "stats_with": r["llama3_rocm"]["triton_war_stats"],
        }
    if "deepseek_v3_rocm" in r and "deepseek_v3_rocm_stock_moe_compile" in r:
        a, b = r["deepseek_v3_rocm"], r["deepseek_v3_rocm_stock_moe_compile"]
        out["moe_compile"] = {
            "tps_ratio_mixed_over_stock_moe_compile": _ratio(a["tps_median"], b["tps_median"]),
            "to_step1_s": {"mixed": a["to_step1_s"], "stock_moe_compile": b["to_step1_s"]},
        }
    if "deepseek_v3_rocm" in r and "deepseek_v3_rocm_loop" in r:
        a, b = r["deepseek_v3_rocm"], r["deepseek_v3_rocm_loop"]
        common = sorted(set(a["loss"]) & set(b["loss"]))
        out["grouped_mm_loop_vs_torch"] = {
            "loss_max_rel_diff": round(max(abs(a["loss"][s] - b["loss"][s]) / abs(a["loss"][s])
                                           for s in common), 5) if common else None,
            "tps_ratio_loop_over_torch": _ratio(b["tps_median"], a["tps_median"]),
        }
    return out


def _tokens_per_step(config: str) -> int | None:
    """local_batch_size x seq_len of a config (per GPU): tokens/s -> step time."""
    try:
        training = tomllib.loads((REPO / config).read_text())["training"]
        return int(training["local_batch_size"]) * int(training["seq_len"])
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError):
        return None


def _syncs(run: dict[str, Any]) -> int | None:
    reports = run.get("reports") or []
    return reports[0].get("syncs") if reports else None


def _loss_diff(run: dict[str, Any], stock: list[dict[str, Any]] | None) -> float | None:
    """Largest relative loss difference to the first stock run, over the steps both logged."""
    if not stock:
        return None
    a, b = run.get("loss") or {}, stock[0].get("loss") or {}
    rel = [abs(a[s] - b[s]) / abs(b[s]) for s in set(a) & set(b) if b[s]]
    return round(max(rel), 6) if rel else None


def figures_of(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every figure a result set supports: the paired runs', the throughput suite's, and the
    graph audits'."""
    figures = compare(results)
    if any("@" in name for name in results):
        figures["throughput"] = throughput(results)
    if any(name in results for name in GRAPH_RUNS):
        figures["moe_graph_inspection"] = graph_inspection(results)
    return figures


def _variant_ratio(table: dict[str, Any], a: str, b: str) -> dict[str, Any] | None:
    """tokens/s of variant ``a`` over ``b``: pooled medians, and pass by pass."""
    if a not in table or b not in table:
        return None
    per_pass = [_ratio(x, y) for x, y in zip(table[a]["tps_median_per_pass"],
                                            table[b]["tps_median_per_pass"], strict=False)]
    return {"pooled": _ratio(table[a]["tps_median"], table[b]["tps_median"]),
            "per_pass": per_pass}


def throughput(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Figures of the mirrored throughput suite: per model, each variant against stock."""
    passes: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name, run in results.items():
        if "@" in name:
            model_variant = name.split("@", 1)[0]
            for model in sorted(THROUGHPUT, key=len, reverse=True):
                variant = model_variant[len(model) + 1:]
                if model_variant.startswith(model + "_") and variant in dict(
                        THROUGHPUT[model].variants):
                    passes.setdefault(model, {}).setdefault(variant, []).append(run)
                    break
    out: dict[str, Any] = {}
    for model, variants in passes.items():
        tokens = _tokens_per_step(THROUGHPUT[model].config)
        table: dict[str, Any] = {}
        for variant, runs in variants.items():
            pooled = [t for r in runs for t in (r.get("tps_intervals") or [])]
            median = statistics.median(pooled) if pooled else None
            table[variant] = {
                "loss_max_rel_diff_vs_stock": _loss_diff(runs[0], variants.get("stock")),
                # The same job twice: how far nondeterministic kernels alone move the curve.
                "loss_max_rel_diff_run_to_run": _loss_diff(runs[-1], runs[:1])
                if len(runs) > 1 else None,
                "tps_median": round(median, 1) if median else None,
                "tps_median_per_pass": [r.get("tps_median") for r in runs],
                "intervals": len(pooled),
                "step_ms_median": round(1000 * tokens / median, 2) if tokens and median else None,
                "peak_memory_gib": [r.get("memory_gib") for r in runs],
                "to_step1_s": [_round(r.get("to_step1_s")) for r in runs],
                "host_syncs": [_syncs(r) for r in runs],
                "guard_checks": [_guard_checks(r) for r in runs],
                "exit": [r.get("exit") for r in runs],
            }

        base = THROUGHPUT[model].also_over
        if base in variants:  # numerics against the second baseline too
            for variant, runs in variants.items():
                if variant != base:
                    table[variant]["loss_max_rel_diff_vs_" + base] = _loss_diff(
                        runs[0], variants[base])
        figures: dict[str, Any] = {"variants": table, "tokens_per_step": tokens}
        for variant in table:
            if variant != "stock" and "stock" in table:
                figures[f"tps_ratio_{variant}_over_stock"] = _variant_ratio(
                    table, variant, "stock")
        if "rocm_on_guard_off" in table:
            figures["tps_ratio_guard_default_over_off"] = _variant_ratio(
                table, "rocm_on", "rocm_on_guard_off")
            figures["tps_ratio_guard_every_step_over_off"] = _variant_ratio(
                table, "rocm_on_every_step", "rocm_on_guard_off")
        for variant in table:
            if base in table and variant not in ("stock", base):
                figures[f"tps_ratio_{variant}_over_{base}"] = _variant_ratio(table, variant, base)
        if "rocm_on" in table and "rocm_on_stock_moe_compile" in table:
            figures["tps_ratio_mixed_over_stock_moe_compile"] = _variant_ratio(
                table, "rocm_on", "rocm_on_stock_moe_compile")
        if "rocm_on_moe_scope" in table:
            figures.update(moe_scope_figures(table))
        if "rocm_on_bf16_combine" in table or "rocm_on_capture_scalars" in table:
            figures.update(memory_figures(table))
        if "rocm_on_every_step_exact" in table and "rocm_on_guard_off" in table:
            figures.update(guard_figures(table))
        out[model] = figures
    return out


def _round(value: float | None, digits: int = 1) -> float | None:
    return round(value, digits) if isinstance(value, (int, float)) else None


def _side_by_side(table: dict[str, Any], rows: list[tuple[str, str]], base: str
                  ) -> list[dict[str, Any]]:
    """One row per variant: throughput and its ratio over ``base``, time to step 1, memory."""
    out = []
    for variant, label in rows:
        if variant not in table:
            continue
        row = table[variant]
        ratio = _variant_ratio(table, variant, base) if variant != base else None
        out.append({
            "variant": variant, "what": label, "tps_median": row["tps_median"],
            f"ratio_over_{base}": ratio["pooled"] if ratio else None,
            f"ratio_over_{base}_per_pass": ratio["per_pass"] if ratio else None,
            "step_ms_median": row["step_ms_median"],
            "to_step1_s": row["to_step1_s"], "peak_memory_gib": row["peak_memory_gib"],
            "host_syncs": row["host_syncs"], "guard_checks": row["guard_checks"],
        })
    return out


def _target(table: dict[str, Any], variant: str, base: str, target: float) -> dict[str, Any]:
    """``variant``'s pooled tokens/s over ``base`` against ``target`` (a benchmark's bar)."""
    ratio = _variant_ratio(table, variant, base)
    pooled = ratio["pooled"] if ratio else None
    return {f"target_over_{base}": target, "pooled": pooled,
            "met": bool(pooled and pooled >= target)}


def moe_scope_figures(table: dict[str, Any]) -> dict[str, Any]:
    """Issue 16, part A: the MoE compile scopes side by side on one GPU."""
    return {
        "moe_scope_side_by_side": _side_by_side(table, [
            ("stock", "stock TorchTitan"),
            ("rocm_on", "rocm_on, moe_eager_scope = block (whole MoE block eager)"),
            ("rocm_on_moe_scope", "rocm_on, moe_eager_scope = moe (MoE module eager)"),
            ("rocm_on_stock_moe_compile", "rocm_on, moe_eager_compile = off (stock MoE compile)"),
        ], "stock"),
        "tps_ratio_moe_scope_over_block": _variant_ratio(table, "rocm_on_moe_scope", "rocm_on"),
        "tps_ratio_moe_scope_over_stock_moe_compile": _variant_ratio(
            table, "rocm_on_moe_scope", "rocm_on_stock_moe_compile"),
        "moe_scope_target": _target(table, "rocm_on_moe_scope", "stock", MOE_SCOPE_TARGET),
    }


def _memory_delta(table: dict[str, Any], variant: str, base: str) -> list[float | None] | None:
    """Peak memory of ``variant`` minus ``base``, pass by pass (GiB; negative: it saves)."""
    if variant not in table or base not in table:
        return None
    return [round(a - b, 2) if a is not None and b is not None else None
            for a, b in zip(table[variant]["peak_memory_gib"], table[base]["peak_memory_gib"],
                            strict=False)]


def memory_figures(table: dict[str, Any]) -> dict[str, Any]:
    """Issue 22, item 3: capture_scalar_outputs and the bf16 MoE combine, side by side."""
    return {
        "memory_side_by_side": _side_by_side(table, [
            ("rocm_on", "rocm_on: capture_scalar_outputs as TorchTitan leaves it, fp32 combine"),
            ("rocm_on_capture_scalars", "rocm_on, capture_scalar_outputs forced on"),
            ("rocm_on_bf16_combine", "rocm_on, moe_combine = bf16"),
        ], "rocm_on"),
        "peak_memory_gib_capture_scalars_minus_default": _memory_delta(
            table, "rocm_on_capture_scalars", "rocm_on"),
        "peak_memory_gib_bf16_combine_minus_fp32": _memory_delta(
            table, "rocm_on_bf16_combine", "rocm_on"),
    }


def guard_figures(table: dict[str, Any]) -> dict[str, Any]:
    """Issue 16, part B: the divergence guard's modes side by side with the guard off."""
    return {
        "guard_side_by_side": _side_by_side(table, [
            ("rocm_on_guard_off", "guard off"),
            ("rocm_on", "divergence_check = log_steps (default)"),
            ("rocm_on_every_step", "divergence_check = every_step (one step late)"),
            ("rocm_on_every_step_exact", "divergence_check = every_step_exact"),
        ], "rocm_on_guard_off"),
        "tps_ratio_guard_every_step_exact_over_off": _variant_ratio(
            table, "rocm_on_every_step_exact", "rocm_on_guard_off"),
        "every_step_target": _target(table, "rocm_on_every_step", "rocm_on_guard_off",
                                     GUARD_TARGET),
    }



def _guard_checks(run: dict[str, Any]) -> dict[str, int] | None:
    """The guard's own end-of-run count (rank 0): checks made, and how many waited."""
    counts = run.get("guard_counts")
    return counts[0] if counts else None


def graph_inspection(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``moe_graphs`` suite: per run and rank, what the audited graphs held."""
    out: dict[str, Any] = {}
    for name, (_, must_be_clean) in GRAPH_RUNS.items():
        run = results.get(name)
        if run is None:
            continue
        ranks = []
        for report in run.get("reports") or []:
            graphs = report.get("graphs")
            if graphs is None:
                continue
            flagged = sorted({f for g in graphs for key in ("collectives", "fsdp", "moe")
                              for f in g.get(key, [])})
            ranks.append({
                "rank": report.get("rank"), "graphs": len(graphs),
                "clean": sum(1 for g in graphs if g.get("clean")), "flagged": flagged,
                "collectives_or_fsdp": sorted({f for g in graphs for key in ("collectives", "fsdp")
                                               for f in g.get(key, [])}),
                "eager_moe_forwards": report.get("eager_moe_forwards"),
            })
        losses = run.get("loss") or {}
        all_clean = bool(ranks) and all(r["clean"] == r["graphs"] for r in ranks)
        out[name] = {
            "exit": run.get("exit"), "ranks": ranks,
            "every_graph_clean": all_clean,
            "expected": "every graph clean" if must_be_clean else
            "MoE routing flagged (positive control)",
            "as_expected": run.get("exit") == 0 and len(ranks) == 2 and (
                all_clean if must_be_clean else any(r["flagged"] for r in ranks)),
            "losses_finite": bool(losses) and all(
                isinstance(v, float) and v == v and abs(v) != float("inf")
                for v in losses.values()),
            "loss_last": losses[max(losses)] if losses else None,
        }
    a = results.get("deepseek_v3_ep2_fsdp2_moe_scope_graphs")
    b = results.get("deepseek_v3_ep2_fsdp2_block_scope_graphs")
    if a and b:
        out["loss_max_rel_diff_moe_vs_block"] = _loss_diff(a, [b])
    return out


_WRITE_LOCK = threading.Lock()


def store_result(out: Path, logs: Path, summary: dict[str, Any]) -> None:
    """A stored result, as :func:`open_stored` reads it: ``summary`` as summary.json and the
    ``logs`` folder as logs.tar.gz, each written beside and moved into place (every benchmark
    stores after every run, so a timeout or a kill mid-write keeps the last whole pair)."""
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(out / "summary.json")
    with tarfile.open(out / "logs.tar.gz.tmp", "w:gz") as tar:
        tar.add(logs, arcname="logs")
    (out / "logs.tar.gz.tmp").replace(out / "logs.tar.gz")


def write_results(out: Path, logs: Path, environment: dict[str, Any],
                  results: dict[str, Any]) -> dict[str, Any]:
    """Write summary.json and logs.tar.gz (after every run: a timeout keeps what finished)."""
    with _WRITE_LOCK:
        figures = figures_of(results)
        store_result(out, logs, {"environment": environment, "figures": figures,
                                 "runs": results})
        return figures


def _lane(runs: list[Run], gpu: int, out: Path, logs: Path, environment: dict[str, Any],
          results: dict[str, Any]) -> None:
    for run in runs:
        ids = [gpu] if run.gpus == 1 else list(range(run.gpus))
        raw = launch(run, logs, ids)
        results[run.name] = analyse(raw)
        write_results(out, logs, environment, results)
        print(f"[{run.name}] exit={raw['exit']} wall={raw['wall_s']}s", flush=True)


class StoredResultError(ValueError):
    """A ``--reanalyse`` directory is not a stored result; the message says why."""


def open_stored(directory: Path) -> tuple[dict[str, Any], Path]:
    """A stored result's ``summary.json``, and the folder its ``logs.tar.gz`` was extracted to.

    Raises:
        StoredResultError: either file is missing or unreadable.
    """
    try:
        stored = json.loads((directory / "summary.json").read_text())
        tmp = Path(tempfile.mkdtemp(prefix="titan-rocm-reanalyse-"))
        with tarfile.open(directory / "logs.tar.gz") as tar:
            tar.extractall(tmp, filter="data")
    except (OSError, ValueError, tarfile.TarError) as exc:
        raise StoredResultError(
            f"--reanalyse {directory}: not a stored result ({exc}); accepted: a directory "
            "holding summary.json and logs.tar.gz as a run with --out wrote them") from None
    return stored, tmp / "logs"


def stored_runs(directory: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A stored result's summary, and each run's raw result with its log extracted again
    (runs never started, whose exit says ``skipped...``, are left out of the second)."""
    stored, logs = open_stored(directory)
    raws = {}
    for name, run in stored["runs"].items():
        if str(run.get("exit")).startswith("skipped"):
            continue
        raws[name] = {k: run.get(k) for k in ("name", "exit", "wall_s", "expect_failure",
                                              "triton_war_stats")}
        raws[name]["log"] = str(logs / f"{name}.log")
    return stored, raws


def reanalyse(directory: Path) -> dict[str, Any]:
    """Recompute the figures from a stored result (summary.json + logs.tar.gz), on any machine."""
    stored, raws = stored_runs(directory)
    results = {name: analyse(raw) for name, raw in raws.items()}
    return {"environment": stored["environment"], "figures": figures_of(results),
            "runs": {n: {k: r[k] for k in ("exit", "tps_median", "to_step1_s", "memory_gib",
                                             "reports", "guard_lines")}
                     for n, r in results.items()}}


def main() -> int:
    """Run a suite and print/write its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=["single", "dual", "throughput", "fp8", "moe_graphs"])
    parser.add_argument("--models", default="llama3,qwen3",
                        help=f"throughput suite: comma-separated, of {sorted(THROUGHPUT)}")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--reanalyse", type=Path, metavar="DIR",
                        help="recompute the figures of a stored result directory (no GPU)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--only", help="comma-separated run names to keep")
    parser.add_argument("--lanes", type=int, choices=[1, 2], default=1,
                        help="2: the two lanes run in parallel on two GPUs (faster, noisier: "
                        "one lane's compiles compete with the other's timed steps)")
    args = parser.parse_args()
    if args.reanalyse:
        try:
            print(json.dumps(reanalyse(args.reanalyse), indent=2, default=str))
        except StoredResultError as exc:
            parser.error(str(exc))
        return 0
    if not args.suite or not args.out:
        parser.error("--suite and --out are required (or --reanalyse DIR)")
    args.out.mkdir(parents=True, exist_ok=True)
    # Logs go to one archive in --out (the device tool brings back at most 8 files).
    logs = Path(tempfile.mkdtemp(prefix="titan-rocm-logs-"))
    import torch

    n_gpu = torch.cuda.device_count()
    environment = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0) if n_gpu else None,
        "gpus": n_gpu, "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "command": " ".join(sys.argv),
    }
    keep = set(args.only.split(",")) if args.only else None
    results: dict[str, Any] = {}
    if args.suite == "single":
        lanes = [[r for r in lane if keep is None or r.name in keep]
                 for lane in single_suite(args.steps)]
        if n_gpu >= 2 and args.lanes == 2:
            threads = [
                threading.Thread(target=_lane,
                                 args=(lane, i, args.out, logs, environment, results))
                for i, lane in enumerate(lanes)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            _lane(lanes[0] + lanes[1], 0, args.out, logs, environment, results)
    elif args.suite in ("throughput", "fp8"):
        if args.suite == "fp8":
            runs = fp8_suite(args.steps)
        else:
            models = [m.strip() for m in args.models.split(",") if m.strip()]
            unknown = [m for m in models if m not in THROUGHPUT]
            if unknown:
                parser.error(f"--models: {unknown} not known; accepted: "
                             f"{', '.join(sorted(THROUGHPUT))}")
            runs = throughput_suite(args.steps, models)
        _lane([r for r in runs if keep is None or r.name in keep], 0, args.out, logs,
              environment, results)
    else:
        if n_gpu < 2:
            print(f"the {args.suite} suite needs 2 GPUs", file=sys.stderr)
            return 2
        suite = dual_suite if args.suite == "dual" else moe_graphs_suite
        _lane([r for r in suite(args.steps) if keep is None or r.name in keep], 0,
              args.out, logs, environment, results)
    figures = write_results(args.out, logs, environment, results)
    print(json.dumps({"environment": environment, "figures": figures}, indent=2, default=str))
    for name, res in sorted(results.items()):
        print(f"{name}: exit={res['exit']} tps_median={res['tps_median']} "
              f"to_step1={res['to_step1_s']} reports={res['reports'][:1]} "
              f"guard={res['guard_lines'][:1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
