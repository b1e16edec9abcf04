"""``titan-rocm plan --tune-problems`` (issue 25, item 5): a table tuned on another device is
refused for the GPU planned, as the run would refuse it, and a problems file that is not this
job's is named, with what differs. Uses the stored validated-tuning result (an H200 table and
the llama3 bench_1B problems it was tuned from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from titan_rocm.cli import main

REPO = Path(__file__).resolve().parents[2]
STORED = REPO / "benchmarks" / "results" / "2026-11-30-h200-d" / "validated-tuning"
JOB = ["--job.config_file", "configs/llama3_debug.toml", "--model.flavor", "bench_1B",
       "--experimental.custom_import", "benchmarks.bench_flavors_rocm", "--arch", "gfx942",
       "--tune-problems", str(STORED / "problems.jsonl")]


def _table_for(tmp_path: Path, device: str, device_key: str) -> Path:
    doc = json.loads((STORED / "gemm.json").read_text())
    old = doc["meta"]["device_key"]
    doc["meta"].update(device=device, device_key=device_key)
    # Keys are "<device key>+<problem key>": the same problems, tuned on this device.
    doc["table"] = {device_key + key[len(old):]: v for key, v in doc["table"].items()}
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps(doc))
    return path


def _lookup(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[dict, str]:
    assert main(["plan", *JOB, *flags, "--json"]) == 0
    out, err = capsys.readouterr()
    (decision,) = [d for d in json.loads(out)["workarounds"] if d["workaround"] == "gemm_lookup"]
    return decision, err


def test_a_table_of_another_device_is_not_used_on_the_gpu_planned(capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    table = str(STORED / "gemm.json")  # meta: device NVIDIA H200
    decision, err = _lookup(capsys, "--rocm.gemm_lookup_table", table)
    assert not decision["applied"]
    assert ("was tuned for another device: device: table 'NVIDIA H200' (device_key 'NVIDIA "
            "H200'), planned 'gfx942'; the run would not use it") in decision["reason"]
    assert main(["plan", *JOB, "--rocm.gemm_lookup_table", table, "--rocm.gemm_lookup", "on",
                 "--job.custom_config_module", "titan_rocm.config"]) == 2
    assert "planned 'gfx942'" in capsys.readouterr().err


def test_a_table_of_this_gpu_covers_its_own_jobs_problems(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(REPO)
    table = _table_for(tmp_path, "AMD Instinct MI300X", "gfx942:sramecc+:xnack-")
    decision, err = _lookup(capsys, "--rocm.gemm_lookup_table", str(table))
    assert decision["applied"], decision["reason"]
    coverage = decision["details"]["coverage"]
    assert coverage["covered"] == coverage["problems"] > 0
    assert coverage["job_differs"] == [] and "warning" not in err


@pytest.mark.parametrize(("flags", "says"), [
    (["--training.seq_len", "1024"], "--training.seq_len 1024"),
    (["--world-size", "2", "--parallelism.data_parallel_shard_degree", "2"],
     "collected on 1 rank(s), this plan has 2"),
])
def test_a_problems_file_of_another_job_is_named(capsys, monkeypatch, tmp_path, flags,
                                                 says) -> None:
    monkeypatch.chdir(REPO)
    table = _table_for(tmp_path, "AMD Instinct MI300X", "gfx942:sramecc+:xnack-")
    decision, err = _lookup(capsys, "--rocm.gemm_lookup_table", str(table), *flags)
    differs = decision["details"]["coverage"]["job_differs"]
    assert any(says in line for line in differs), differs
    assert "is not this job's" in err and says in err
