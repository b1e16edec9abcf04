"""The CPU parts of benchmarks/tt030_validation.py: its probe, its run set parsed by TorchTitan
0.3.0's own ConfigManager, and its figures recomputed from a stored result (--reanalyse)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from benchmarks import tt030_validation as validation
from benchmarks.harness import store_result


def test_probe_finds_torch_names_this_torch_lacks(tmp_path):
    package = tmp_path / "torchtitan"
    (package / "distributed").mkdir(parents=True)
    (package / "experiments").mkdir()
    (package / "distributed" / "utils.py").write_text(
        "import torch\n"
        "from torch.nn import Linear\n"
        "from torch.distributed import no_such_api_in_torch\n"
        "def f(t):\n"
        "    torch.distributed.also_missing.deeper(t)\n"
        "    return torch.nn.functional.relu(t) + torch.ops.aten.foo(t)\n"
    )
    (package / "experiments" / "x.py").write_text("import torch\ntorch.not_read_here\n")
    missing = validation.missing_torch_apis(package)
    assert missing == {
        "torch.distributed.also_missing": ["distributed/utils.py"],
        "torch.distributed.no_such_api_in_torch": ["distributed/utils.py"],
    }


def test_probe_of_the_installed_torchtitan_names_set_timeout_on_this_torch():
    """torch 2.13 (this CPU build) lacks what TorchTitan 0.3.0 calls after step 1."""
    import torch.distributed as dist
    import torchtitan

    missing = validation.missing_torch_apis(Path(torchtitan.__file__).parent,
                                            validation.TRAINER_PATHS)
    assert ("torch.distributed.set_timeout" in missing) == (not hasattr(dist, "set_timeout"))


def test_every_run_parses_with_torchtitan_and_rocm_runs_build_rocm_trainer():
    from torchtitan.config import ConfigManager

    from titan_rocm.adapters.tt030 import RocmTrainer

    debug, mirrored = validation.runs(steps=20, throughput_steps=30)
    assert len(debug) == 7 and len(mirrored) == 8
    for run in [*debug, mirrored[0], mirrored[1]]:
        config = ConfigManager().parse_args(
            ["--module", run.module, "--config", run.config, *run.flags])
        rocm = run.module == validation.ROCM or run.config.endswith("_rocm")
        stock = run.name.endswith("_stock") or "_stock@" in run.name
        assert rocm != stock, run.name
        assert isinstance(config, RocmTrainer.Config) == rocm, run.name
        assert config.compile.enable and config.debug.seed == 42
        if rocm:
            assert config.rocm.moe_eager_compile in ("on", "off")
            assert config.rocm.grouped_mm == "on"


LOG = """$ torchrun ...
[titan] 2026-11-30 13:02:02,000 - root - INFO - Training starts at step 1
[titan] 2026-11-30 13:02:03,383 - root - INFO - step:  1  loss:  8.15984  grad_norm:  1.1859  memory:  0.90GiB(0.00%)  tps: 36  tflops: 0.00  mfu: 0.00%
[titan] 2026-11-30 13:02:04,311 - root - INFO - step: 10  loss:  {loss10}  grad_norm:  1.1777  memory:  1.03GiB(0.00%)  tps: {tps}  tflops: 0.03  mfu: 0.01%
[titan] 2026-11-30 13:02:05,311 - root - INFO - step: 20  loss:  7.90000  grad_norm:  1.1000  memory:  1.03GiB(0.00%)  tps: {tps}  tflops: 0.03  mfu: 0.01%
TITAN_ROCM_RUN_REPORT {{"rank": 0, "eager_moe_forwards": {eager}, "grouped_mm_calls": {calls}}}
"""  # noqa: E501 - TorchTitan 0.3.0's log lines as its metrics processor prints them


def _stored(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    runs = {
        "deepseek_v3_stock": LOG.format(loss10="8.10000", tps=1000, eager="null",
                                        calls="null"),
        "deepseek_v3_rocm": LOG.format(loss10="8.10810", tps=990, eager='{"1": 20}',
                                       calls='{"torch": 100}'),
        "llama3_nan_step7": LOG.split("step: 10")[0].rsplit("\n", 1)[0] + (
            "\n[titan] 2026-11-30 13:02:04,311 - titan_rocm - ERROR - titan-rocm divergence "
            "guard: training diverged at step 7: loss = nan, grad_norm = nan (found at log step "
            "10).\n"),
    }
    results = {}
    for name, text in runs.items():
        (logs / f"{name}.log").write_text(text)
        raw = {"name": name, "exit": 1 if "nan" in name else 0, "wall_s": 30.0,
               "log": str(logs / f"{name}.log"), "expect_failure": "nan" in name,
               "triton_war_stats": None}
        results[name] = validation.analyse_run(raw)
    results["llama3_1b_stock@a"] = {"name": "llama3_1b_stock@a", "exit": "skipped: time budget"}
    out = tmp_path / "result"
    out.mkdir()
    store_result(out, logs, validation.summary({"gpu": "test"},
                                               {"trainer_imports": True, "shims": []}, results))
    return out


def test_figures_and_reanalyse_agree_on_a_stored_result(tmp_path):
    out = _stored(tmp_path)
    stored = json.loads((out / "summary.json").read_text())
    figures = stored["figures"]
    assert figures["deepseek_v3"]["loss_max_rel_diff"] == pytest.approx(0.001, abs=1e-5)
    assert figures["deepseek_v3"]["eager_moe_forwards"] == {"1": 20}
    assert figures["deepseek_v3"]["grouped_mm_calls"] == {"torch": 100}
    assert figures["nan_injection"]["stopped_as"][0].startswith(
        "[titan] 2026-11-30 13:02:04,311 - titan_rocm - ERROR - titan-rocm divergence guard: "
        "training diverged at step 7")
    assert "llama3_1b_throughput" not in figures  # skipped runs give no figure
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == [
            "logs/deepseek_v3_rocm.log", "logs/deepseek_v3_stock.log",
            "logs/llama3_nan_step7.log"]
    again = validation.reanalyse(out)
    assert json.loads(json.dumps(again["figures"], default=str)) == figures
