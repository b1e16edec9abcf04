"""benchmarks/validated_tuning.py's analysis on CPU: ``--reanalyse`` of a synthetic result."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from benchmarks import validated_tuning as bench
from titan_rocm.tuned_gemms.records import Appender

WRONG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}


def _log(path: Path, start: int, tps: int, loss: float, report: dict, picks: str = "") -> None:
    lines = [f"[rank0]:[titan] 2026-11-30 10:00:{start:02d},000 - root - INFO - "
             "Training starts at step 1"]
    for step in range(1, 31):
        lines.append(f"[rank0]:[titan] 2026-11-30 10:01:{step:02d},000 - root - INFO - "
                     f"step: {step}  loss: {loss + step / 100:.5f}  grad_norm:  1.0000  "
                     f"memory: 10.00GiB(5.00%)  tps: {tps:,}  tflops: 100.0  mfu: 10.00%")
    if picks:
        lines += ["AUTOTUNE mm(16384x2048, 2048x2048)", "strides: ...", "dtypes: ...", picks]
    lines.append("TITAN_ROCM_TUNE_PROOF_REPORT " + json.dumps(report))
    path.write_text("\n".join(lines) + "\n")


def test_reanalyse_recomputes_every_figure(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    _log(logs / "default@0.log", 50, 100_000, 10.0, {"select_algorithm_autotune": 0})
    _log(logs / "default@1.log", 52, 100_000, 10.0001, {"select_algorithm_autotune": 0})
    _log(logs / "max_autotune@0.log", 0, 110_000, 10.5, {"select_algorithm_autotune": 12},
         "triton_mm_3 0.1 ms 100.0% ACC_TYPE='tl.float32', BLOCK_K=64, BLOCK_M=128, BLOCK_N=128")
    _log(logs / "table@0.log", 40, 111_000, 10.0, {"select_algorithm_autotune": 0,
                                                    "lookups": {"hits": 9, "misses": 0}})
    _log(logs / "table_bs4@0.log", 40, 60_000, 10.0, {"select_algorithm_autotune": 0,
                                                       "lookups": {"hits": 3, "misses": 6}})
    with tarfile.open(tmp_path / "logs.tar.gz", "w:gz") as tar:
        tar.add(logs, arcname="logs")
    (tmp_path / "summary.json").write_text(json.dumps({"environment": {"gpu": "H200"},
                                                       "phases": {}}))
    results = Appender(tmp_path / "results.jsonl")
    for i, (status, params) in enumerate([("pass", {}), ("mismatch", WRONG),
                                          ("cuda_error", {"BLOCK_M": 64})]):
        results.write({"type": "started", "task": str(i)})
        results.write({"type": "result", "task": str(i), "key": "k", "status": status,
                       "template_id": "aten::mm" if i == 0 else "triton::mm", "params": params})
    results.close()
    (tmp_path / "gemm.json").write_text(json.dumps(
        {"meta": {}, "table": {"x+k": [{"template_id": "aten::mm"}]}}))
    figures = bench.reanalyse(tmp_path)["figures"]
    assert figures["to_step1_table_over_max_autotune"] == pytest.approx(21 / 61, abs=1e-3)
    assert figures["speed_table_over_max_autotune"] == pytest.approx(1.0091, abs=1e-3)
    assert figures["max_autotune_picked_wrong_config"] == 1
    assert figures["loss_rel_diff_table_vs_aten"] == 0.0
    assert 0 < figures["loss_rel_diff_identical_jobs"] < 1e-4
    assert figures["lookups"]["table_bs4"][0]["misses"] == 6
    assert figures["autotuned"]["table"] == [0]
    tune = figures["tune"]
    assert tune["statuses"] == {"pass": 1, "mismatch": 1, "cuda_error": 1}
    assert tune["wrong_config_statuses"] == ["mismatch"]
    assert tune["rerun_after_kill"] == 0 and tune["table_holds_wrong_config"] is False
