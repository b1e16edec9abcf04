"""Validate titan-rocm inside TorchTitan 0.2.2's real trainer on GPUs, and measure what it costs.

One command on a GPU box (run from the repository root, titan-rocm importable):

    python -m benchmarks.gpu_validation --suite single --out results/     # 1-2 GPUs
    python -m benchmarks.gpu_validation --suite dual --out results/       # needs 2 GPUs
    python -m benchmarks.gpu_validation --suite throughput --models llama3_1b,qwen3_1.7b \
        --steps 60 --out results/                                        # 1 GPU, ratios
    python -m benchmarks.gpu_validation --suite fp8 --steps 30 --out results/   # torchao 0.16
    python -m benchmarks.gpu_validation --suite throughput --models deepseek_v3_4b \
        --steps 30 --out results/                     # 1 GPU: MoE scopes side by side
    python -m benchmarks.gpu_validation --suite throughput --models llama3_1b_guard \
        --steps 40 --out results/                     # 1 GPU: divergence guard modes
    python -m benchmarks.gpu_validation --suite throughput --models deepseek_v3_4b_memory \
        --steps 30 --out results/                     # 1 GPU: capture_scalar_outputs, bf16
                                                      # MoE combine: peak memory, speed
    python -m benchmarks.gpu_validation --suite moe_graphs --steps 20 --out results/
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
debug config stock vs rocm. It prints its figures and writes ``summary.json``
and ``logs.tar.gz`` to ``--out`` after every run; ``--reanalyse DIR`` recomputes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import STOCK, Run, max_rel_diff, ratio, report_value

# Named, not left to the default (it was "moe" for a while): runs stay comparable across time.
ROCM_ON = [*harness.ROCM_ON, "--rocm.moe_eager_scope", "block"]
SEED = ["--debug.seed", "42"]
LOG10 = ["--metrics.log_freq", "10"]


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


@dataclass(frozen=True)
class ThroughputModel:
    """One model of the throughput suite: its config and the variants compared on it."""

    config: str
    variants: list[tuple[str, list[str]]]
    """(name, flags) pairs, the baseline first: "stock", which every ``*_over_stock`` ratio
    divides by, or (a model without a stock run) its :attr:`also_over` variant."""
    flags: list[str] = field(default_factory=list)
    """Flags every variant gets (e.g. the flavor)."""
    bench_flavors: bool = False
    """Needs ``benchmarks/bench_flavors.py`` (a flavor TorchTitan 0.2.2 does not ship)."""
    also_over: str | None = None
    """A second baseline: every other variant also gets its ratio over this one."""
    variant_env: dict[str, dict[str, str]] = field(default_factory=dict)
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
        out[model] = {
            "tps_ratio_rocm_over_stock": ratio(rocm["tps_median"], stock["tps_median"]),
            # Per-interval spread (min, max): how far apart one run's own intervals are.
            "tps_spread_stock": _spread(stock),
            "tps_spread_rocm": _spread(rocm),
            "loss_max_rel_diff": max_rel_diff(rocm["loss"], stock["loss"], 5),
            "loss_step1": (stock["loss"].get(1), rocm["loss"].get(1)),
            "loss_last": (stock["loss"].get(common[-1]) if common else None,
                          rocm["loss"].get(common[-1]) if common else None),
            "to_step1_s": (stock["to_step1_s"], rocm["to_step1_s"]),
            "memory_gib": (stock["memory_gib"], rocm["memory_gib"]),
        }
    r = results
    if "llama3_rocm" in r and "llama3_rocm_guard_off" in r:
        syncs = {k: report_value(r[k], "syncs")
                 for k in ("llama3_rocm_guard_off", "llama3_rocm", "llama3_rocm_every_step")
                 if k in r}
        out["divergence_guard"] = {
            "tps_ratio_default_over_off": ratio(r["llama3_rocm"]["tps_median"],
                                                 r["llama3_rocm_guard_off"]["tps_median"]),
            "tps_ratio_every_step_over_off": ratio(
                r.get("llama3_rocm_every_step", {}).get("tps_median"),
                r["llama3_rocm_guard_off"]["tps_median"]),
            "host_syncs_whole_run": syncs,
        }
    if "llama3_rocm" in r and "llama3_rocm_nowar" in r:
        out["triton_war_compile"] = {
            "to_step1_s_with": r["llama3_rocm"]["to_step1_s"],
            "to_step1_s_without": r["llama3_rocm_nowar"]["to_step1_s"],
            "ratio_with_over_without": ratio(r["llama3_rocm"]["to_step1_s"],
                                              r["llama3_rocm_nowar"]["to_step1_s"]),
            "stats_with": r["llama3_rocm"]["triton_war_stats"],
        }
    if "deepseek_v3_rocm" in r and "deepseek_v3_rocm_stock_moe_compile" in r:
        a, b = r["deepseek_v3_rocm"], r["deepseek_v3_rocm_stock_moe_compile"]
        out["moe_compile"] = {
            "tps_ratio_mixed_over_stock_moe_compile": ratio(a["tps_median"], b["tps_median"]),
            "to_step1_s": {"mixed": a["to_step1_s"], "stock_moe_compile": b["to_step1_s"]},
        }
    if "deepseek_v3_rocm" in r and "deepseek_v3_rocm_loop" in r:
        a, b = r["deepseek_v3_rocm"], r["deepseek_v3_rocm_loop"]
        out["grouped_mm_loop_vs_torch"] = {
            "loss_max_rel_diff": max_rel_diff(b["loss"], a["loss"], 5),
            "tps_ratio_loop_over_torch": ratio(b["tps_median"], a["tps_median"]),
        }
    return out

def _loss_diff(run: dict[str, Any], stock: list[dict[str, Any]] | None) -> float | None:
    """Largest relative loss difference to the first stock run, over the steps both logged."""
    if not stock:
        return None
    return max_rel_diff(run.get("loss") or {}, stock[0].get("loss") or {}, 6)


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
    per_pass = [ratio(x, y) for x, y in zip(table[a]["tps_median_per_pass"],
                                            table[b]["tps_median_per_pass"], strict=False)]
    return {"pooled": ratio(table[a]["tps_median"], table[b]["tps_median"]),
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
        tokens = harness.tokens_per_step(THROUGHPUT[model].config)
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
                "host_syncs": [report_value(r, "syncs") for r in runs],
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
        over = _variant_ratio(table, variant, base) if variant != base else None
        out.append({
            "variant": variant, "what": label, "tps_median": row["tps_median"],
            f"ratio_over_{base}": over["pooled"] if over else None,
            f"ratio_over_{base}_per_pass": over["per_pass"] if over else None,
            "step_ms_median": row["step_ms_median"],
            "to_step1_s": row["to_step1_s"], "peak_memory_gib": row["peak_memory_gib"],
            "host_syncs": row["host_syncs"], "guard_checks": row["guard_checks"],
        })
    return out


def _target(table: dict[str, Any], variant: str, base: str, target: float) -> dict[str, Any]:
    """``variant``'s pooled tokens/s over ``base`` against ``target`` (a benchmark's bar)."""
    over = _variant_ratio(table, variant, base)
    pooled = over["pooled"] if over else None
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


# -- a call -------------------------------------------------------------------------------------


def suite_lanes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[list[Run]]:
    """The runs of ``--suite`` (kept to ``--only``), in lanes: the single suite has two (one per
    GPU with ``--lanes 2``), every other one."""
    if args.suite == "single":
        lanes = list(single_suite(args.steps))
    elif args.suite == "fp8":
        lanes = [fp8_suite(args.steps)]
    elif args.suite == "throughput":
        models = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = [m for m in models if m not in THROUGHPUT]
        if unknown:
            parser.error(f"--models: {unknown} not known; accepted: "
                         f"{', '.join(sorted(THROUGHPUT))}")
        lanes = [throughput_suite(args.steps, models)]
    else:
        lanes = [(dual_suite if args.suite == "dual" else moe_graphs_suite)(args.steps)]
    keep = set(args.only.split(",")) if args.only else None
    return [[r for r in lane if keep is None or r.name in keep] for lane in lanes]


def summary(call: harness.Call) -> dict[str, Any]:
    """What a call stores: its environment, every figure, every run's analysis."""
    return {"environment": call.environment, "figures": figures_of(call.results),
            "runs": call.results}


def run_lane(call: harness.Call, runs: list[Run], gpu: int) -> None:
    """``runs`` one after the other: one-GPU runs on ``gpu``, the others on GPUs 0..n-1."""
    for run in runs:
        call.run(run, harness.analyse, [gpu] if run.gpus == 1 else list(range(run.gpus)))


def reanalyse(directory: Path) -> dict[str, Any]:
    """Recompute the figures from a stored result (summary.json + logs.tar.gz), on any machine."""
    with harness.stored_runs(directory) as (stored, raws):
        results = {name: harness.analyse(raw) for name, raw in raws.items()}
    return {"environment": stored["environment"], "figures": figures_of(results),
            "runs": {n: {k: r[k] for k in ("exit", "tps_median", "to_step1_s", "memory_gib",
                                             "reports", "guard_lines")}
                     for n, r in results.items()}}


def main(argv: list[str] | None = None) -> int:
    """Run a suite and print/write its figures."""
    parser = harness.parser(__doc__)
    parser.add_argument("--suite", choices=["single", "dual", "throughput", "fp8", "moe_graphs"])
    parser.add_argument("--models", default="llama3,qwen3",
                        help=f"throughput suite: comma-separated, of {sorted(THROUGHPUT)}")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--only", help="comma-separated run names to keep")
    parser.add_argument("--lanes", type=int, choices=[1, 2], default=1,
                        help="2: the two lanes run in parallel on two GPUs (faster, noisier: "
                        "one lane's compiles compete with the other's timed steps)")
    args = parser.parse_args(argv)
    if args.reanalyse:
        return harness.print_reanalysis(parser, reanalyse, args.reanalyse)
    if not args.suite:
        parser.error("--suite is required (with --out DIR or --list), or --reanalyse DIR")
    lanes = suite_lanes(parser, args)
    if args.list:
        print("\n".join(run.describe() for lane in lanes for run in lane))
        return 0
    out = harness.require_out(parser, args)
    import torch

    n_gpu = torch.cuda.device_count()
    if args.suite in ("dual", "moe_graphs") and n_gpu < 2:
        print(f"the {args.suite} suite needs 2 GPUs", file=sys.stderr)
        return 2
    # Logs go to one archive in --out (the device tool brings back at most 8 files).
    call = harness.Call(out, summary)
    if len(lanes) == 2 and n_gpu >= 2 and args.lanes == 2:
        threads = [threading.Thread(target=run_lane, args=(call, lane, i))
                   for i, lane in enumerate(lanes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        run_lane(call, [r for lane in lanes for r in lane], 0)
    figures = call.store()["figures"]
    print(json.dumps({"environment": call.environment, "figures": figures}, indent=2,
                     default=str))
    for name, res in sorted(call.results.items()):
        print(f"{name}: exit={res['exit']} tps_median={res.get('tps_median')} "
              f"to_step1={res.get('to_step1_s')} reports={(res.get('reports') or [])[:1]} "
              f"guard={(res.get('guard_lines') or [])[:1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
