"""benchmarks/gpu_validation.py's pure parts, on CPU: the stock TOML and the throughput figures.

The GPU runs themselves are in benchmarks/results/; these tests keep the analysis honest.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from benchmark_loader import load_benchmark

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    return load_benchmark("gpu_validation")


def test_stock_config_drops_titan_rocm_and_keeps_float8(harness: ModuleType,
                                                        tmp_path: Path) -> None:
    stock = harness.stock_config(REPO / "configs" / "deepseek_v3_debug_fp8.toml", tmp_path)
    config = tomllib.loads(stock.read_text())
    assert config["model"]["converters"] == ["quantize.linear.float8",
                                             "quantize.grouped_mm.float8"]
    assert "rocm" not in config and "custom_import" not in config.get("experimental", {})
    assert "custom_config_module" not in config["job"]


def test_throughput_suite_mirrors_the_variants(harness: ModuleType) -> None:
    names = [r.name for r in harness.throughput_suite(300, ["qwen3"])]
    assert names == ["qwen3_stock@1", "qwen3_rocm@1", "qwen3_rocm_on@1",
                     "qwen3_rocm_on@2", "qwen3_rocm@2", "qwen3_stock@2"]
    assert all(r.shared_cache for r in harness.throughput_suite(300, ["llama3"]))


def _run(tps: list[float], syncs: int) -> dict:
    return {"tps_intervals": tps, "tps_median": sorted(tps)[len(tps) // 2],
            "memory_gib": 1.0, "reports": [{"syncs": syncs}], "exit": 0}


def test_throughput_pools_both_passes_and_ratios_each(harness: ModuleType) -> None:
    results = {
        "llama3_stock@1": _run([100.0, 100.0, 100.0], 191),
        "llama3_rocm_on@1": _run([99.0, 99.0, 99.0], 191),
        "llama3_rocm_on_guard_off@1": _run([100.0, 100.0, 100.0], 191),
        "llama3_rocm_on_guard_off@2": _run([102.0, 102.0, 102.0], 191),
        "llama3_rocm_on@2": _run([101.0, 101.0, 101.0], 191),
        "llama3_stock@2": _run([102.0, 102.0, 102.0], 191),
    }
    figures = harness.throughput(results)["llama3"]
    assert figures["tokens_per_step"] == 8 * 2048
    on = figures["variants"]["rocm_on"]
    assert on["intervals"] == 6 and on["tps_median"] == 100.0
    assert on["host_syncs"] == [191, 191]
    assert figures["tps_ratio_rocm_on_over_stock"]["per_pass"] == [0.99, round(101 / 102, 4)]
    assert figures["tps_ratio_rocm_on_over_stock"]["pooled"] == round(100 / 101, 4)
    assert figures["tps_ratio_guard_default_over_off"]["pooled"] == round(100 / 101, 4)
    assert "tps_ratio_guard_every_step_over_off" in figures  # absent variant: None, not error
    assert figures["tps_ratio_guard_every_step_over_off"] is None


def test_every_throughput_model_has_a_config_and_a_known_flavor(harness: ModuleType) -> None:
    """A typo in a flavor name would only show up on the GPU box: check them here."""
    from torchtitan.protocols.train_spec import get_train_spec

    import benchmarks.bench_flavors  # noqa: F401  - registers the bench_* flavors

    for model, spec in harness.THROUGHPUT.items():
        assert [v for v, _ in spec.variants][0] == "stock", model  # the ratios' baseline
        name = tomllib.loads((REPO / spec.config).read_text())["model"]["name"]
        flags = spec.flags
        flavor = flags[flags.index("--model.flavor") + 1] if "--model.flavor" in flags else None
        if flavor is not None:
            assert flavor in get_train_spec(name).model_args, (model, flavor)
