"""benchmarks/harness.py on CPU: importing a benchmark makes nothing on disk; a run's command,
environment and caches; a call stores after every result and keeps to its budget; stored
results are read back (and refused with a sentence); the standard command line."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import benchmarks
from benchmarks import harness
from benchmarks.harness import STOCK, Run

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[3]
MODULES = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__))


@pytest.mark.slow
def test_importing_any_benchmark_makes_nothing_on_disk(tmp_path: Path) -> None:
    """Folders and caches are made when a run or a call starts, never at import."""
    temp, cwd = tmp_path / "temp", tmp_path / "cwd"
    temp.mkdir()
    cwd.mkdir()
    assert len(MODULES) > 15 and "harness" in MODULES and "gpu_validation" in MODULES
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)"
    env = dict(os.environ, TMPDIR=str(temp), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    names = [f"benchmarks.{m}" for m in MODULES]
    subprocess.run([sys.executable, "-c", code, *names], cwd=cwd, env=env, check=True)
    assert list(temp.iterdir()) == [] and list(cwd.iterdir()) == []


def test_stock_config_drops_titan_rocm_and_keeps_float8(tmp_path: Path) -> None:
    stock = harness.stock_config(REPO / "configs" / "deepseek_v3_debug_fp8.toml", tmp_path)
    config = tomllib.loads(stock.read_text())
    assert config["model"]["converters"] == ["quantize.linear.float8",
                                             "quantize.grouped_mm.float8"]
    assert "rocm" not in config and "custom_import" not in config.get("experimental", {})
    assert "custom_config_module" not in config["job"]


@pytest.mark.parametrize("script", ["gpu_validation", "mla_varlen_packing", "tt030_validation",
                                    "validated_tuning", "audit_matrix", "numerics_audit"])
@pytest.mark.parametrize("kind", ["missing", "not_an_archive"])
def test_reanalyse_of_a_bad_directory_says_what_is_accepted(script: str, kind: str,
                                                             tmp_path: Path) -> None:
    """Every benchmark's --reanalyse reads stored results through open_stored: a directory
    that is not one is named, with what is accepted, exit 2, no traceback."""
    bad = tmp_path / "result"
    if kind == "not_an_archive":
        bad.mkdir()
        (bad / "summary.json").write_text("{}")
        (bad / "logs.tar.gz").write_text("not a tar archive")
    run = subprocess.run([sys.executable, "-m", f"benchmarks.{script}", "--reanalyse", str(bad)],
                         cwd=REPO, capture_output=True, text=True, check=False)
    assert run.returncode == 2, run.stderr
    assert f"--reanalyse {bad}: not a stored result" in run.stderr
    assert "accepted: a directory holding summary.json and logs.tar.gz" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every temporary folder the harness makes goes under this test's own."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setattr(harness._Shared, "cache", None)
    return folder


def test_launch_runs_the_runner_module_under_torchrun(temp: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[str], dict[str, str], float | None]] = []

    def run_logged(cmd: list[str], log: Path, env: dict[str, str], timeout: float | None
                   ) -> tuple[int, float]:
        seen.append((cmd, env, timeout))
        return 0, 1.04

    monkeypatch.setattr(harness, "run_logged", run_logged)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    stock = Run("a_stock", "configs/llama3_debug.toml", ["--x", "1", *STOCK], timeout=9)
    raw = harness.launch(stock, tmp_path, [1])
    assert raw == {"name": "a_stock", "exit": 0, "wall_s": 1.0, "expect_failure": False,
                   "log": str(tmp_path / "a_stock.log"), "triton_war_stats": None}
    cmd, env, timeout = seen[0]
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"] and timeout == 9
    runner = cmd.index("-m", 3)
    assert cmd[runner:runner + 3] == ["-m", "benchmarks.torchtitan_runner", "--job.config_file"]
    config = Path(cmd[runner + 3])
    assert config.parent.parent == temp  # a stock copy, in the run's own folder
    assert tomllib.loads(config.read_text())["model"]["converters"] == []
    assert "--stock" not in cmd and cmd[-2:] == ["--x", "1"]
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["COUNT_SYNCS"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent == config.parent  # its own, cold
    for name in ("b", "c"):
        harness.launch(Run(name, "llama3_debugmodel", ["--y"], gpus=2, module="llama3",
                           shared_cache=True, env={"K": name}), tmp_path, [0, 1])
    (b, b_env, _), (c, c_env, _) = seen[1:]
    assert "--nproc_per_node=2" in b and b[b.index("--local-ranks-filter") + 1] == "0,1"
    job = b.index("--module")
    assert b[job:job + 5] == ["--module", "llama3", "--config", "llama3_debugmodel",
                              "--dump_folder"]
    assert b_env["CUDA_VISIBLE_DEVICES"] == "4,5" and (b_env["K"], c_env["K"]) == ("b", "c")
    assert b_env["TORCHINDUCTOR_CACHE_DIR"] == c_env["TORCHINDUCTOR_CACHE_DIR"]  # shared
    assert b_env["TORCHINDUCTOR_CACHE_DIR"] != env["TORCHINDUCTOR_CACHE_DIR"]
    ports = [next(a for a in x if a.startswith("--master_port=")) for x in (cmd, b, c)]
    assert len(set(ports)) == 3


def test_a_call_stores_after_every_result_and_skips_what_its_budget_cannot_fit(
        temp: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    call = harness.Call(out, lambda c: {"environment": c.environment, "runs": dict(c.results)},
                        budget_s=30.0, seeds=3)
    assert call.environment["seeds"] == 3 and "torch" in call.environment
    assert call.logs.parent == temp
    (call.logs / "a.log").write_text("a line\n")
    call.record("a", {"name": "a", "exit": 0})
    assert json.loads((out / "summary.json").read_text())["runs"] == {"a": {"name": "a",
                                                                         "exit": 0}}
    assert call.skip_unless("b", 60.0, expect_failure=True)
    assert not call.skip_unless("c", 1.0) and "c" not in call.results
    stored = json.loads((out / "summary.json").read_text())
    assert stored["runs"]["b"] == {"name": "b", "exit": harness.SKIPPED, "expect_failure": True}
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "summary.json"]
    with harness.stored_runs(out) as (summary, raws):
        assert summary["environment"]["seeds"] == 3
        assert list(raws) == ["a"]  # the skipped run is left out
        log = Path(raws["a"]["log"])
        assert log.read_text() == "a line\n"
    assert not log.parent.exists()  # the extraction is removed
    unlimited = harness.Call(tmp_path / "more", lambda c: {})
    assert unlimited.left_s() == float("inf") and not unlimited.skip_unless("x", 1e9)


def test_list_prints_the_runs_and_out_is_required() -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "benchmarks.gpu_validation", *args],
                              cwd=REPO, capture_output=True, text=True, check=False)

    listed = cli("--suite", "throughput", "--models", "qwen3", "--list")
    assert listed.returncode == 0, listed.stderr
    assert [line.split(":")[0] for line in listed.stdout.splitlines()] == [
        "qwen3_stock@1", "qwen3_rocm@1", "qwen3_rocm_on@1", "qwen3_rocm_on@2", "qwen3_rocm@2",
        "qwen3_stock@2"]
    no_out = cli("--suite", "fp8")
    assert no_out.returncode == 2 and "--out DIR is required" in no_out.stderr
    assert "Traceback" not in no_out.stderr


def test_a_stored_environment_names_the_allocator_settings_it_ran_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What fits on a card depends on the caching allocator's settings: a result made with
    them says so, and one made without them has no such key."""
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert "allocator" not in harness.environment()
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert harness.environment(seeds=1)["allocator"] == {
        "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
