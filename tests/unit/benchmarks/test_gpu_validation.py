"""benchmarks/gpu_validation.py's pure parts, on CPU: its suites and the throughput figures.

The GPU runs themselves are in benchmarks/results/; these tests keep the analysis honest.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import gpu_validation as bench

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[3]


def test_throughput_suite_mirrors_the_variants() -> None:
    names = [r.name for r in bench.throughput_suite(300, ["qwen3"])]
    assert names == ["qwen3_stock@1", "qwen3_rocm@1", "qwen3_rocm_on@1",
                     "qwen3_rocm_on@2", "qwen3_rocm@2", "qwen3_stock@2"]
    assert all(r.shared_cache for r in bench.throughput_suite(300, ["llama3"]))


def _run(tps: list[float], syncs: int) -> dict:
    return {"tps_intervals": tps, "tps_median": sorted(tps)[len(tps) // 2],
            "memory_gib": 1.0, "reports": [{"syncs": syncs}], "exit": 0}


def test_throughput_pools_both_passes_and_ratios_each() -> None:
    results = {
        "llama3_stock@1": _run([100.0, 100.0, 100.0], 191),
        "llama3_rocm_on@1": _run([99.0, 99.0, 99.0], 191),
        "llama3_rocm_on_guard_off@1": _run([100.0, 100.0, 100.0], 191),
        "llama3_rocm_on_guard_off@2": _run([102.0, 102.0, 102.0], 191),
        "llama3_rocm_on@2": _run([101.0, 101.0, 101.0], 191),
        "llama3_stock@2": _run([102.0, 102.0, 102.0], 191),
    }
    figures = bench.throughput(results)["llama3"]
    assert figures["tokens_per_step"] == 8 * 2048
    on = figures["variants"]["rocm_on"]
    assert on["intervals"] == 6 and on["tps_median"] == 100.0
    assert on["host_syncs"] == [191, 191]
    assert figures["tps_ratio_rocm_on_over_stock"]["per_pass"] == [0.99, round(101 / 102, 4)]
    assert figures["tps_ratio_rocm_on_over_stock"]["pooled"] == round(100 / 101, 4)
    assert figures["tps_ratio_guard_default_over_off"]["pooled"] == round(100 / 101, 4)
    assert "tps_ratio_guard_every_step_over_off" in figures  # absent variant: None, not error
    assert figures["tps_ratio_guard_every_step_over_off"] is None


def test_every_throughput_model_has_a_config_and_a_known_flavor() -> None:
    """A typo in a flavor name would only show up on the GPU box: check them here."""
    from torchtitan.protocols.train_spec import get_train_spec

    import benchmarks.bench_flavors  # noqa: F401  - registers the bench_* flavors

    for model, spec in bench.THROUGHPUT.items():
        baseline = [v for v, _ in spec.variants][0]
        assert baseline in ("stock", spec.also_over), model  # the ratios' baseline
        name = tomllib.loads((REPO / spec.config).read_text())["model"]["name"]
        flags = spec.flags
        flavor = flags[flags.index("--model.flavor") + 1] if "--model.flavor" in flags else None
        if flavor is not None:
            assert flavor in get_train_spec(name).model_args, (model, flavor)


# -- issue 16: MoE scopes, guard modes, graph audits; and their reanalysis from logs ------------


def _log(path: Path, *, tps: list[float], to_step1: float, memory: float,
         report: dict | None = None, guard: tuple[int, int] | None = None,
         ranks: int = 1) -> None:
    """A torchrun-teed TorchTitan log: a start line, step lines every 10 steps, the report."""
    lines = []
    for rank in range(ranks):
        p = f"[rank{rank}]:[titan] 2026-11-30 10:00:"
        lines.append(f"{p}00,000 - root - INFO - Training starts at step 1")
        seconds = f"{to_step1:06.3f}".replace(".", ",")
        steps = [1] + [10 * (i + 1) for i in range(len(tps))]
        for step, value in zip(steps, [tps[0], *tps], strict=True):
            stamp = seconds if step == 1 else "59,000"
            lines.append(f"{p}{stamp} - root - INFO - step: {step:2d}  loss:  {8 - step / 100:.4f}"
                         f"  grad_norm:  1.0000  memory: {memory:.2f}GiB(47.00%)  "
                         f"tps: {value:,.0f}  tflops: 1.00  mfu: 1.00%")
        if guard:
            lines.append(f"{p}59,500 - titan_rocm - INFO - titan-rocm: divergence guard: "
                         f"{guard[0]} check(s), {guard[1]} of them waited for the device "
                         "(divergence_check = every_step)")
        if report is not None:
            lines.append(f"[rank{rank}]:TITAN_ROCM_RUN_REPORT "
                         + json.dumps({**report, "rank": rank}))
    path.write_text("\n".join(lines) + "\n")


def _store(directory: Path, runs: dict[str, dict]) -> Path:
    """A result directory as the harness writes it: summary.json and logs.tar.gz."""
    import tarfile

    logs = directory / "logs"
    logs.mkdir(parents=True)
    for name, spec in runs.items():
        _log(logs / f"{name}.log", **spec)
    stored = {name: {"name": name, "exit": 0, "wall_s": 50.0, "expect_failure": False,
                     "triton_war_stats": None} for name in runs}
    (directory / "summary.json").write_text(json.dumps(
        {"environment": {"gpu": "test"}, "figures": {}, "runs": stored}))
    with tarfile.open(directory / "logs.tar.gz", "w:gz") as tar:
        tar.add(logs, arcname="logs")
    return directory


SCOPE_RUNS = {  # variant: (tokens/s per pass, to step 1 per pass, peak memory)
    "stock": ((30_000, 30_200), (23.0, 5.0), 65.15),
    "rocm_on": ((28_200, 28_400), (9.5, 4.0), 66.48),
    "rocm_on_moe_scope": ((29_700, 29_800), (14.0, 4.5), 65.50),
    "rocm_on_stock_moe_compile": ((30_100, 30_100), (14.8, 4.7), 64.81),
}


def test_reanalysis_puts_the_moe_scopes_side_by_side(tmp_path: Path) -> None:
    runs = {}
    for variant, (tps, step1, memory) in SCOPE_RUNS.items():
        for p in (1, 2):
            runs[f"deepseek_v3_4b_{variant}@{p}"] = {
                "tps": [tps[p - 1]] * 4, "to_step1": step1[p - 1], "memory": memory,
                "report": {"syncs": 300}}
    figures = bench.reanalyse(_store(tmp_path, runs))["figures"]
    deepseek = figures["throughput"]["deepseek_v3_4b"]
    rows = {r["variant"]: r for r in deepseek["moe_scope_side_by_side"]}
    assert list(rows) == list(SCOPE_RUNS)
    moe = rows["rocm_on_moe_scope"]
    assert moe["tps_median"] == 29_750.0
    assert moe["ratio_over_stock"] == round(29_750 / 30_100, 4)
    assert moe["ratio_over_stock_per_pass"] == [round(29_700 / 30_000, 4),
                                               round(29_800 / 30_200, 4)]
    assert moe["to_step1_s"] == [14.0, 4.5] and moe["peak_memory_gib"] == [65.5, 65.5]
    assert moe["host_syncs"] == [300, 300]
    assert rows["stock"]["ratio_over_stock"] is None  # the baseline itself
    assert deepseek["tps_ratio_moe_scope_over_block"]["pooled"] == round(29_750 / 28_300, 4)
    assert deepseek["tps_ratio_moe_scope_over_stock_moe_compile"]["pooled"] == round(
        29_750 / 30_100, 4)
    assert deepseek["moe_scope_target"] == {"target_over_stock": 0.98,
                                            "pooled": round(29_750 / 30_100, 4), "met": True}


def test_moe_scope_target_is_missed_below_0_98() -> None:
    table = {v: {"tps_median": t, "tps_median_per_pass": [t], "step_ms_median": 1.0,
                 "to_step1_s": [1.0], "peak_memory_gib": [1.0], "host_syncs": [1],
                 "guard_checks": [None]}
             for v, t in (("stock", 100.0), ("rocm_on", 93.0), ("rocm_on_moe_scope", 97.9),
                          ("rocm_on_stock_moe_compile", 100.0))}
    assert bench.moe_scope_figures(table)["moe_scope_target"]["met"] is False


def test_reanalysis_puts_the_guard_modes_side_by_side(tmp_path: Path) -> None:
    modes = {  # variant: (tokens/s, guard's (checks, waited))
        "rocm_on_guard_off": (57_800, None), "rocm_on": (57_650, (5, 0)),
        "rocm_on_every_step": (57_500, (41, 0)), "rocm_on_every_step_exact": (52_000, (41, 40)),
    }
    runs = {f"llama3_1b_guard_{v}@{p}": {"tps": [tps] * 3, "to_step1": 6.0, "memory": 37.73,
                                         "report": {"syncs": 218}, "guard": guard}
            for v, (tps, guard) in modes.items() for p in (1, 2)}
    figures = bench.reanalyse(_store(tmp_path, runs))["figures"]
    guard = figures["throughput"]["llama3_1b_guard"]
    rows = {r["variant"]: r for r in guard["guard_side_by_side"]}
    assert rows["rocm_on_every_step"]["ratio_over_rocm_on_guard_off"] == round(57_500 / 57_800, 4)
    assert rows["rocm_on_every_step"]["guard_checks"] == [{"checks": 41, "waited": 0}] * 2
    assert rows["rocm_on_every_step_exact"]["guard_checks"][0] == {"checks": 41, "waited": 40}
    assert rows["rocm_on_guard_off"]["guard_checks"] == [None, None]
    assert rows["rocm_on"]["host_syncs"] == [218, 218]
    assert guard["every_step_target"]["met"] is True  # 0.9948 >= 0.99
    assert guard["tps_ratio_guard_every_step_exact_over_off"]["pooled"] == round(
        52_000 / 57_800, 4)
    assert not any(k.endswith("_over_stock") for k in guard)  # no stock run in this model


def test_memory_suite_forces_capture_scalars_by_environment_only() -> None:
    runs = {r.name: r for r in bench.throughput_suite(30, ["deepseek_v3_4b_memory"])}
    assert list(runs) == [f"deepseek_v3_4b_memory_{v}@{p}" for v, p in (
        ("rocm_on", 1), ("rocm_on_capture_scalars", 1), ("rocm_on_bf16_combine", 1),
        ("rocm_on_bf16_combine", 2), ("rocm_on_capture_scalars", 2), ("rocm_on", 2))]
    forced = {"TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS": "1"}
    for name, run in runs.items():
        assert run.env == (forced if "capture_scalars" in name else {}), name
        assert ("--rocm.moe_combine" in run.flags) is ("bf16_combine" in name), name
        assert run.flags[run.flags.index("--model.flavor") + 1] == "bench_moe_4B"
    # Same flags for the default and the forced run: only the environment differs.
    assert (runs["deepseek_v3_4b_memory_rocm_on@1"].flags
            == runs["deepseek_v3_4b_memory_rocm_on_capture_scalars@1"].flags)


def test_reanalysis_puts_memory_side_by_side(tmp_path: Path) -> None:
    spec = {"rocm_on": (28_000, 66.5), "rocm_on_capture_scalars": (27_900, 67.9),
            "rocm_on_bf16_combine": (28_100, 65.1)}
    runs = {f"deepseek_v3_4b_memory_{v}@{p}": {"tps": [tps] * 3, "to_step1": 9.0,
                                               "memory": memory + p / 10}
            for v, (tps, memory) in spec.items() for p in (1, 2)}
    figures = bench.reanalyse(_store(tmp_path, runs))["figures"]
    memory = figures["throughput"]["deepseek_v3_4b_memory"]
    rows = {r["variant"]: r for r in memory["memory_side_by_side"]}
    assert list(rows) == list(spec)
    assert rows["rocm_on_bf16_combine"]["ratio_over_rocm_on"] == round(28_100 / 28_000, 4)
    assert rows["rocm_on_capture_scalars"]["peak_memory_gib"] == [68.0, 68.1]
    assert memory["peak_memory_gib_bf16_combine_minus_fp32"] == [-1.4, -1.4]
    assert memory["peak_memory_gib_capture_scalars_minus_default"] == [1.4, 1.4]
    # Numerics against the default run (the synthetic losses are equal).
    assert memory["variants"]["rocm_on_bf16_combine"]["loss_max_rel_diff_vs_rocm_on"] == 0.0
    assert not any(k.endswith("_over_stock") for k in memory)  # no stock run in this model


def _graph(clean: bool, **flags: list[str]) -> dict:
    return {"nodes": 10, "ops": [], "collectives": [], "fsdp": [], "moe": [], **flags,
            "clean": clean}


def test_reanalysis_reads_the_graph_audits_of_both_ranks(tmp_path: Path) -> None:
    clean = {"graphs": [_graph(True), _graph(True)], "eager_moe_forwards": {"1": 20}}
    flagged = {"graphs": [_graph(True), _graph(False, moe=["torch.topk"])]}
    runs = {
        "deepseek_v3_ep2_fsdp2_moe_scope_graphs": {"report": clean},
        "deepseek_v3_ep2_fsdp2_block_scope_graphs": {"report": clean},
        "deepseek_v3_ep2_fsdp2_stock_moe_compile_graphs": {"report": flagged},
    }
    for spec in runs.values():
        spec.update(tps=[80_000.0, 80_000.0], to_step1=12.0, memory=3.4, ranks=2)
    inspection = bench.reanalyse(_store(tmp_path, runs))["figures"][
        "moe_graph_inspection"]
    moe = inspection["deepseek_v3_ep2_fsdp2_moe_scope_graphs"]
    assert [r["rank"] for r in moe["ranks"]] == [0, 1]
    assert moe["every_graph_clean"] and moe["as_expected"] and moe["losses_finite"]
    assert moe["ranks"][0]["eager_moe_forwards"] == {"1": 20}
    control = inspection["deepseek_v3_ep2_fsdp2_stock_moe_compile_graphs"]
    assert not control["every_graph_clean"] and control["as_expected"]
    assert control["ranks"][1]["flagged"] == ["torch.topk"]
    assert inspection["loss_max_rel_diff_moe_vs_block"] == 0.0


def test_a_flagged_graph_under_the_moe_scope_is_not_as_expected() -> None:
    reports = [{"rank": r, "graphs": [_graph(False, collectives=["all_to_all_single"])]}
               for r in (0, 1)]
    results = {"deepseek_v3_ep2_fsdp2_moe_scope_graphs": {
        "exit": 0, "reports": reports, "loss": {1: 8.0}}}
    moe = bench.graph_inspection(results)["deepseek_v3_ep2_fsdp2_moe_scope_graphs"]
    assert moe["as_expected"] is False
    assert moe["ranks"][0]["collectives_or_fsdp"] == ["all_to_all_single"]


def test_moe_graphs_suite_records_on_two_gpus() -> None:
    runs = bench.moe_graphs_suite(20)
    assert [r.name for r in runs] == list(bench.GRAPH_RUNS)
    for run in runs:
        assert run.gpus == 2 and run.env == {"TITAN_ROCM_RECORD_GRAPHS": "1"}
        assert "titan_rocm_record_inductor" in run.flags
        assert "--parallelism.expert_parallel_degree" in run.flags
    assert "moe" in runs[0].flags  # --rocm.moe_eager_scope moe


def test_runner_records_every_graph_it_hands_on() -> None:
    """benchmarks/torchtitan_runner.py's recording backend: audit, then the inner compiler."""
    import torch

    from benchmarks import torchtitan_runner as runner

    runner._register_recording_backend(inner="eager")
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.topk(x * 2, 2).values, backend=runner.RECORD_BACKEND)
    torch.testing.assert_close(fn(torch.arange(4.0)), torch.tensor([6.0, 4.0]))
    assert len(runner._graphs) == 1
    assert list(runner._graphs[0]["moe"]) == ["torch._VariableFunctionsClass.topk"]
    assert runner._graphs[0]["clean"] is False
