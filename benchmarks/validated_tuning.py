"""GPU proof of issue 12: ``titan-rocm tune`` collect -> run -> table, then training side by side.

One command on one GPU, from the repository root (titan-rocm and TorchTitan 0.2.2 importable):

    python -m benchmarks.validated_tuning --out results/DIR
    python -m benchmarks.validated_tuning --reanalyse results/DIR     # any machine, no GPU

On llama3 ``bench_1B`` (benchmarks/bench_flavors.py), bf16, one GPU, it runs:

1. ``tune collect`` (one step), ``tune run`` with faults injected -- a wrong-but-fast Triton mm
   config (``TITAN_ROCM_TUNE_WRONG_MM``: configs with blocks 64/64/16, the largest tile of the
   capped candidate list, skip 15/16 of K in every process of the proof, so it is the fastest
   candidate and wrong), an illegal memory access and a SIGSEGV on two other candidates --
   killed with SIGKILL after a few results and resumed, then ``tune table``;
2. training, fresh Inductor/Triton caches per run, FX-graph and AOT caches off, in mirrored
   order: ``default`` (ATen GEMMs), ``max_autotune`` (max-autotune-gemm at job start, ATEN,TRITON)
   and ``table`` (``rocm.gemm_lookup``), ``--repeats`` each; then ``table`` with another batch
   size (misses). Each run reports Inductor's ``select_algorithm_autotune`` counter and the
   table's hits and misses.

To fit about 9 minutes on an H200 the candidates are capped at ``--max-mm-configs`` per
template (Inductor's ``test_configs.max_mm_configs``, in the tuner and in every run alike), 30
steps (step time: median over steps 10-30), 2 repeats. It writes ``summary.json`` and
``logs.tar.gz`` to ``--out`` after every phase (the tune files beside them).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import harness

WRONG_BLOCKS = "64,64,16"
"""BLOCK_M,BLOCK_N,BLOCK_K of the injected wrong config: it must be among the first
``--max-mm-configs`` of Inductor's mm configs, or no process ever offers it."""
LEGACY_WRONG_BLOCKS = "128,128,64"
"""What results stored before ``environment.wrong_blocks`` existed injected (2026-11-30-h200-d:
outside the 6-config cap, so it was never a candidate)."""
FAULTS = "ima:triton::mm#1@0,crash:triton::mm#2@0"
CONFIG = "configs/llama3_debug.toml"
BASE = ["--job.config_file", CONFIG, "--model.flavor", "bench_1B", "--debug.seed", "42",
        "--metrics.log_freq", "1", "--experimental.custom_import", "benchmarks.bench_flavors_rocm",
        "--checkpoint.no-enable"]
REPORT = "TITAN_ROCM_TUNE_PROOF_REPORT "


# -- the child: TorchTitan's trainer with the proof's knobs ---------------------------------

def child() -> None:
    """Run ``torchtitan.train`` with the test knobs applied; report counters at exit."""
    import atexit

    import torch._inductor.config as inductor_config

    from titan_rocm.testing import faults

    faults.install_from_env()

    def report() -> None:
        from torch._dynamo.utils import counters

        out: dict[str, Any] = {
            "select_algorithm_autotune": int(counters["inductor"]["select_algorithm_autotune"])}
        handler = inductor_config.inductor_choices_class
        if handler is not None:
            made = handler()
            stats = getattr(made, "stats", None)
            out["lookups"] = stats.to_dict() if stats is not None else None
        print(REPORT + json.dumps(out), flush=True)

    atexit.register(report)
    sys.argv = ["torchtitan.train", *sys.argv[2:]]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


# -- phases ----------------------------------------------------------------------------------

def _env(tmp: Path, cap: int, **extra: str) -> dict[str, str]:
    return harness.child_env(
        tmp, TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
        TITAN_ROCM_TUNE_WRONG_MM=WRONG_BLOCKS, TITAN_ROCM_TUNE_MAX_MM_CONFIGS=str(cap),
        CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"), **extra)


def _sh(cmd: list[str], log: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    code, wall = harness.run_logged(cmd, log, env, timeout)
    return {"exit": code, "wall_s": round(wall, 1), "log": log.name}


def _torchrun(*args: str) -> list[str]:
    return harness.torchrun(1, *args, tee=False)


def tune(call: harness.Call, cap: int) -> None:
    """collect -> run (killed with SIGKILL after 6 results, resumed) -> table, each phase
    recorded as it ends."""
    out, logs = call.out, call.logs
    tmp = harness.fresh_dir("tune")
    env = _env(tmp, cap)
    problems, results, table = out / "problems.jsonl", out / "results.jsonl", out / "gemm.json"
    call.record("collect", _sh(_torchrun("-m", "titan_rocm.cli", "tune", "collect", *BASE,
                                         "--job.dump_folder", str(tmp / "dump"), "-o",
                                         str(problems)), logs / "collect.log", env, 300))
    run = [sys.executable, "-m", "titan_rocm.cli", "tune", "run", str(problems), "-o",
           str(results), "--gpus", "0", "--timeout", "20", "--json"]
    start = time.monotonic()
    with open(logs / "run_killed.log", "w") as f:
        proc = subprocess.Popen(run, cwd=harness.REPO,
                                env={**env, "TITAN_ROCM_TUNE_FAULTS": FAULTS},
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        while proc.poll() is None and _count(results, "result") < 6 and \
                time.monotonic() - start < 240:
            time.sleep(0.5)
        killed_with = _count(results, "result")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    call.record("run_killed", {"results_at_kill": killed_with,
                               "wall_s": round(time.monotonic() - start, 1)})
    call.record("run_resumed", _sh(run, logs / "run_resumed.log",
                                   {**env, "TITAN_ROCM_TUNE_FAULTS": FAULTS}, 600))
    call.record("table", _sh([sys.executable, "-m", "titan_rocm.cli", "tune", "table",
                              str(results), "-o", str(table), "--json"], logs / "table.log",
                             env, 60))


def _count(path: Path, kind: str) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if f'"type": "{kind}"' in line)
    except OSError:
        return 0


VARIANTS: dict[str, list[str]] = {
    "default": [],
    "max_autotune": [],  # env below
    "table": ["--rocm.gemm_lookup", "on", "--rocm.gemm_lookup_table", "{table}"],
}


def train(name: str, out: Path, logs: Path, cap: int, steps: int) -> dict:
    """One training run with fresh caches."""
    tmp = harness.fresh_dir(name)
    env = _env(tmp, cap)
    variant = name.split("@")[0]
    if variant.startswith("max_autotune"):
        env.update(TORCHINDUCTOR_MAX_AUTOTUNE_GEMM="1",
                   TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS="ATEN,TRITON")
    cmd = _torchrun("-m", "benchmarks.validated_tuning", "--child",
                    *training_flags(name, out, steps), "--job.dump_folder",
                    str(tmp / "dump"))
    return _sh(cmd, logs / f"{name}.log", env, 900)


def training_flags(name: str, out: Path, steps: int) -> list[str]:
    """The trainer's flags of training run ``name`` (``variant@repeat``; ``_bs4``: a local
    batch of 4, which the table's GEMMs were not tuned for)."""
    flags = [f.replace("{table}", str(out / "gemm.json")) for f in
             VARIANTS.get(name.split("@")[0].split("_bs")[0], [])]
    batch = ["--training.local_batch_size", "4"] if "bs4" in name else []
    return [*BASE, "--training.steps", str(steps), *flags, *batch]


# -- analysis (CPU) ---------------------------------------------------------------------------

_AUTOTUNE = re.compile(r"AUTOTUNE mm\(")


def analyse_run(log: Path, steps_from: int = 10) -> dict[str, Any]:
    """Loss, time to step 1, median step time (steps >= steps_from), counters of one run."""
    raw = harness.analyse({"log": str(log), "name": log.stem, "exit": None, "wall_s": None,
                   "expect_failure": False, "triton_war_stats": None})
    text = log.read_text(errors="replace")
    reports = [json.loads(x.split(REPORT, 1)[1]) for x in text.splitlines() if REPORT in x]
    step_ms = [1000.0 / r for s, r in _tps(raw).items() if s >= steps_from and r]
    picks = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _AUTOTUNE.search(line) and i + 3 < len(lines):
            picks.append(lines[i + 3].strip())  # the fastest choice, first after strides/dtypes
    return {"loss": raw["loss"], "to_step1_s": raw["to_step1_s"],
            "step_time_rel_median": statistics.median(step_ms) if step_ms else None,
            "report": reports[-1] if reports else None, "autotune_picks": picks}


def _tps(raw: dict[str, Any]) -> dict[int, float]:
    tps = raw.get("tps_intervals") or []
    steps = [s for s in raw.get("steps_logged", []) if s > 10]
    return dict(zip(steps, tps, strict=False))


def _rel(a: dict[int, float], b: dict[int, float]) -> float | None:
    return harness.max_rel_diff(a, b, 6)


def figures(directory: Path, logs: Path) -> dict[str, Any]:
    """Every figure of the proof, from the stored logs and tune files."""
    from titan_rocm.tuned_gemms import records

    runs = {p.stem: analyse_run(p) for p in sorted(logs.glob("*@*.log"))}
    by: dict[str, list[dict[str, Any]]] = {}
    for name, run in runs.items():
        by.setdefault(name.split("@")[0], []).append(run)

    def med(variant: str, key: str) -> float | None:
        values = [r[key] for r in by.get(variant, []) if r[key] is not None]
        return statistics.median(values) if values else None

    out: dict[str, Any] = {"variants": {v: {"to_step1_s": med(v, "to_step1_s"),
                                            "step_time_rel": med(v, "step_time_rel_median"),
                                            "reports": [r["report"] for r in rs]}
                                        for v, rs in by.items()}}
    t1 = {v: med(v, "to_step1_s") for v in ("default", "max_autotune", "table")}
    st = {v: med(v, "step_time_rel_median") for v in ("default", "max_autotune", "table")}
    if all(t1.values()):
        out["to_step1_table_over_max_autotune"] = round(t1["table"] / t1["max_autotune"], 3)
        out["to_step1_table_over_default"] = round(t1["table"] / t1["default"], 3)
    if all(st.values()):
        # Step time is 1/tokens-per-second here: a ratio >= 1 means the table is as fast.
        out["speed_table_over_max_autotune"] = round(st["max_autotune"] / st["table"], 4)
        out["speed_table_over_default"] = round(st["default"] / st["table"], 4)
    out["lookups"] = {v: [(r["report"] or {}).get("lookups") for r in rs]
                      for v, rs in by.items() if v.startswith("table")}
    out["autotuned"] = {v: [(r["report"] or {}).get("select_algorithm_autotune") for r in rs]
                        for v, rs in by.items()}
    if by.get("default") and by.get("table"):
        out["loss_rel_diff_table_vs_aten"] = _rel(by["table"][0]["loss"], by["default"][0]["loss"])
    if len(by.get("default", [])) > 1:
        out["loss_rel_diff_identical_jobs"] = _rel(by["default"][1]["loss"],
                                                   by["default"][0]["loss"])
    if by.get("max_autotune") and by.get("default"):
        out["loss_rel_diff_max_autotune_vs_aten"] = _rel(by["max_autotune"][0]["loss"],
                                                         by["default"][0]["loss"])
    wrong_params = _wrong_params(directory)
    if by.get("max_autotune") and by.get("default"):
        wrong = ", ".join(f"{k}={wrong_params[k]}" for k in ("BLOCK_K", "BLOCK_M", "BLOCK_N"))
        picks = [p for r in by["max_autotune"] for p in r["autotune_picks"]]
        out["max_autotune_picked_wrong_config"] = sum(wrong in p for p in picks)
    state = records.load_state(directory / "results.jsonl")
    wrong_results = [r for r in state.results.values() if r["template_id"] == "triton::mm"
                     and all(r["params"].get(k) == v for k, v in wrong_params.items())]
    out["tune"] = {"statuses": dict(state.counts()), "garbled_lines": state.garbled,
                   "wrong_config_statuses": sorted({r["status"] for r in wrong_results}),
                   "rerun_after_kill": _reruns(directory / "results.jsonl")}
    table_file = directory / "gemm.json"
    if table_file.exists():
        entries = json.loads(table_file.read_text())["table"].values()
        out["tune"]["table_entries"] = len(entries)
        out["tune"]["table_holds_wrong_config"] = any(
            e.get("template_id") == "triton::mm" and all(e.get(k) == v for k, v in
                                                          wrong_params.items())
            for es in entries for e in es)
    return out


def _reruns(path: Path) -> int:
    """Tasks that got a ``started`` record after their terminal record (must be 0)."""
    from titan_rocm.tuned_gemms import records

    done: set[str] = set()
    again = 0
    for r in records.read_records(path)[0]:
        if r["type"] == "result":
            done.add(r["task"])
        elif r["type"] == "started" and r["task"] in done:
            again += 1
    return again


def reanalyse(directory: Path) -> dict[str, Any]:
    """Recompute every figure from ``summary.json`` + ``logs.tar.gz`` (+ tune files), on CPU."""
    with harness.open_stored(directory) as (stored, logs):
        return {"environment": stored.get("environment"), "phases": stored.get("phases"),
                "figures": figures(directory, logs)}


def _wrong_params(directory: Path) -> dict[str, int]:
    """The injected wrong config's blocks, as the run that wrote ``directory`` injected them."""
    summary = directory / "summary.json"
    env = json.loads(summary.read_text()).get("environment", {}) if summary.exists() else {}
    m, n, k = (int(x) for x in env.get("wrong_blocks", LEGACY_WRONG_BLOCKS).split(","))
    return {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}


TRAINING_VARIANTS = ("default", "max_autotune", "table", "table_bs4")


def training_runs(variants: list[str], repeats: int) -> list[str]:
    """The training runs after the tune, in order: the first three variants mirrored per
    repeat, then ``table_bs4`` once."""
    order = [v for v in TRAINING_VARIANTS[:3] if v in variants]
    names = [f"{v}@{i}" for i in range(repeats) for v in (order if i % 2 == 0 else order[::-1])]
    return [*names, *(["table_bs4@0"] if "table_bs4" in variants else [])]


def summary(call: harness.Call) -> dict[str, Any]:
    """What a call stores: environment, the phases, and once a training run ended, figures."""
    out: dict[str, Any] = {"environment": call.environment, "phases": call.results}
    if any("@" in name for name in call.results):
        out["figures"] = figures(call.out, call.logs)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the proof (or ``--reanalyse``)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child()
        return 0
    parser = harness.parser(__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-mm-configs", type=int, default=6)
    parser.add_argument("--variants", default=",".join(TRAINING_VARIANTS),
                        help="training variants to run after the tune (of "
                        f"{', '.join(TRAINING_VARIANTS)})")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(TRAINING_VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; accepted: "
                     f"{', '.join(TRAINING_VARIANTS)}")
    if args.reanalyse:
        return harness.print_reanalysis(parser, reanalyse, args.reanalyse)
    names = training_runs(variants, args.repeats)
    if args.list:
        print("collect, run (killed, resumed), table: titan-rocm tune of " + " ".join(BASE))
        for name in names:
            print(f"{name}: {' '.join(training_flags(name, Path('DIR'), args.steps))}")
        return 0
    out = harness.require_out(parser, args)
    call = harness.Call(out, summary, steps=args.steps, repeats=args.repeats,
                        max_mm_configs=args.max_mm_configs, wrong_blocks=WRONG_BLOCKS,
                        variants=variants)
    tune(call, args.max_mm_configs)
    for name in names:
        call.record(name, train(name, out, call.logs, args.max_mm_configs, args.steps))
        print(f"[{name}] {call.results[name]}", flush=True)
    print(json.dumps(call.store().get("figures"), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
