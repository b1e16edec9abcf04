"""benchmarks/numerics_audit.py on CPU: every figure of the stored schema-1 results, from
synthetic logs and a real one.

The logs are written as a GPU call would leave them: torchrun's ``[rankN]:`` prefixes, the
audit's ``--json`` object pretty-printed by rank 0 (the contract the audit keeps), the
fault's summary line, TorchTitan's step lines. ``--reanalyse`` of a stored directory must
give the figures the run gave.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import numerics_audit as bench
from benchmarks.harness import store_result


def _param(name: str, block: int | None, ratio: float, flagged: bool = False) -> dict[str, Any]:
    return {"name": name, "block": block, "compiled": True, "workarounds": [], "numel": 4096,
            "err_job": ratio * 1e-3, "err_eager": 1e-3, "ratio": ratio, "max_abs": 1e-4,
            "outlier_fraction": 0.03 if flagged else 0.0, "flagged": flagged,
            "reason": "outliers" if flagged else None}


def audit_json(ratios: dict[str, float], flagged: set[str] = frozenset()) -> dict[str, Any]:
    """An audit result as the contract writes it (schema 1)."""
    params = []
    for name, ratio in ratios.items():
        block = int(name.split(".")[1]) if name.startswith("layers.") else None
        params.append(_param(name, block, ratio, name in flagged))
    blocks = {}
    for p in params:
        if p["block"] is None:
            continue
        b = blocks.setdefault(p["block"], {"block": f"layers.{p['block']}", "compiled": True,
                                           "flagged": [], "worst_ratio": 0.0})
        b["worst_ratio"] = max(b["worst_ratio"], p["ratio"])
        if p["flagged"]:
            b["flagged"].append(p["name"])
    verdict = "flagged" if flagged else "ok"
    return {"schema": 1, "verdict": verdict, "exit_code": 1 if flagged else 0, "error": None,
            "world_size": 1, "tokens": 4096, "reference_dtype": "float64",
            "job_dtype": "bfloat16", "settings": {"fudge": 8.0},
            "loss": {"job": 7.1, "eager": 7.1, "reference": 7.1, "err_job": 1e-5,
                     "err_eager": 1e-5, "flagged": False},
            "parameters": params, "blocks": [blocks[k] for k in sorted(blocks)],
            "origin": None,
            "time_s": {"job": 20.0, "eager": 5.0, "reference": 9.0, "total": 34.0},
            "peak_memory_bytes": 30 * 2**30}


CLEAN = {f"layers.{b}.{w}": r for b in range(4) for w, r in (("w1", 0.5), ("w2", 1.1))}
CLEAN["tok_embeddings.weight"] = 0.9


def _audit_log(result: dict[str, Any], hits: int = 0, ranks: int = 1) -> str:
    lines = ["$ python -m torch.distributed.run ... numerics_audit.py --json"]
    for rank in range(ranks):
        lines.append(f"[rank{rank}]:[titan] 2026-12-01 16:00:00,000 - root - INFO - Building")
    lines += [f"[rank0]:{line}" for line in json.dumps(result, indent=2).splitlines()]
    if ranks > 1:
        lines.append('[rank1]:{"schema": 99}')  # another rank's noise is never read
    summary = {"spec": {"block": 3}, "hits": {"hits": hits, "changed": 30, "elements": 1000}}
    lines.append(f"[rank0]:{bench.SUMMARY_MARK}{json.dumps(summary)}")
    return "\n".join(lines) + "\n"


def _train_log(losses: list[float], tps: int = 40_000, start_s: int = 0) -> str:
    head = ("[rank0]:[titan] 2026-12-01 16:00:00,000 - root - INFO - Training starts at "
            "step 1\n")
    return head + "".join(
        f"[rank0]:[titan] 2026-12-01 16:00:{start_s + i:02d},000 - root - INFO - step: {i + 1}  "
        f"loss: {loss:7.5f}  grad_norm:  1.2345  memory: 40.00GiB(28.00%)  tps: {tps:,}\n"
        for i, loss in enumerate(losses))


def test_audit_json_is_read_from_rank_0s_prefixed_lines() -> None:
    result = audit_json(CLEAN)
    text = _audit_log(result, ranks=2)
    assert bench.audit_result(text) == result
    assert bench.corrupt_summary(text)["hits"]["hits"] == 0
    assert bench.audit_result("[rank0]:no json here\n") is None


def test_audit_json_survives_a_stderr_line_torchrun_interleaved() -> None:
    """torchrun --tee tails stdout and stderr apart: on the H200 the fault's at-exit line
    landed inside the corrupted audit's JSON (benchmarks/results/2026-12-01-h200/
    numerics-audit-2), and the analysis read "no audit JSON in the log"."""
    result = audit_json(CLEAN)
    lines = _audit_log(result, ranks=1).splitlines(keepends=True)
    middle = next(i for i, line in enumerate(lines) if '"err_eager"' in line)
    lines.insert(middle, "[rank0]:titan-rocm: TITAN_ROCM_DEBUG_CORRUPT at exit: 1 time(s)\n")
    assert bench.audit_result("".join(lines)) == result
    # Right after the opening "{" (the audit's INFO line on the H200, audit-table-3).
    opening = next(i for i, line in enumerate(lines) if line == "[rank0]:{\n")
    lines.insert(opening + 1, "[rank0]:[titan] 2026-12-01 18:29:24,181 - titan_rocm - INFO - "
                              "numerics audit: 147 parameters\n")
    assert bench.audit_result("".join(lines)) == result


def test_clean_distribution_and_a_fault_named_by_its_block() -> None:
    dist = bench.ratio_distribution(audit_json(CLEAN))
    assert dist["parameters"] == 9 and dist["max"] == 1.1 and dist["median"] == 0.9
    assert dist["p99"] == 1.1 and dist["flagged"] == 0
    bad = dict(CLEAN, **{"layers.2.w1": 40.0, "layers.2.w2": 12.0, "layers.1.w1": 9.0,
                         "layers.3.w1": 9.5})
    verdict = bench.judge_corrupt(audit_json(bad, {"layers.2.w1", "layers.2.w2"}), 2)
    assert verdict["flagged"] and verdict["only_that_block"] and verdict["worst_is_right"]
    assert verdict["origin"] == "layers.2" and verdict["origin_is_right"]
    # the error carried on through block 2's input gradient into block 1: still right
    upstream = audit_json(bad, {"layers.2.w1", "layers.1.w1"})
    upstream["origin"] = "layers.2"
    spread = bench.judge_corrupt(upstream, 2)
    assert spread["origin_is_right"] and spread["later_blocks_clean"]
    assert not spread["only_that_block"] and spread["upstream_flagged"] == [1]
    assert spread["flagged_blocks"] == ["layers.2", "layers.1"]  # worst first
    # a block the fault cannot reach (after it) flagged: wrong
    wrong = bench.judge_corrupt(audit_json(bad, {"layers.2.w1", "layers.3.w1"}), 2)
    assert wrong["origin_is_right"] and not wrong["later_blocks_clean"]
    missed = bench.judge_corrupt(audit_json(CLEAN), 2)
    assert not missed["flagged"] and not missed["origin_is_right"]
    assert bench.block_id("(outside blocks)") is None and bench.block_id("layers.12") == 12


def _store(tmp_path: Path, logs: dict[str, str], runs: dict[str, Any]) -> Path:
    out = tmp_path / "stored"
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    for name, text in logs.items():
        (log_dir / f"{name}.log").write_text(text)
    out.mkdir()
    store_result(out, log_dir, {"environment": {"gpu": "synthetic"}, "runs": runs})
    return out


def test_reanalyse_recomputes_every_figure(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = dict(CLEAN, **{"layers.3.w1": 40.0})
    logs = {
        "llama3_1b_audit": _audit_log(audit_json(CLEAN)),
        "llama3_1b_audit_corrupt": _audit_log(audit_json(bad, {"layers.3.w1"}), hits=1),
        "llama3_1b_train": _train_log([7.5, 7.4, 7.3, 7.2], tps=40_000),
        "llama3_fsdp2_train": _train_log([7.5, 7.4, 7.3]),
        "llama3_fsdp2_train_first_step_audit": _train_log([7.5, 7.4, 7.3], start_s=9),
        "llama3_1b_full_audit_aten": _audit_log(audit_json(CLEAN)),
        # The table moves block 2's w1 gradient 3 x further from float64 than ATen does.
        "llama3_1b_full_audit_table": _audit_log(audit_json(dict(CLEAN, **{"layers.2.w1": 1.5}))),
    }
    runs = {name: {"exit": 1 if "corrupt" in name else 0, "wall_s": 60.0} for name in logs}
    runs["llama3_fsdp2_train_first_step_audit"]["wall_s"] = 75.0
    runs["qwen3_1.7b_audit"] = {"name": "qwen3_1.7b_audit", "exit": "skipped: time budget"}
    figures = bench.reanalyse(_store(tmp_path, logs, runs))["figures"]
    assert figures["false_positives"] == 0
    assert figures["clean"]["llama3_1b_audit"]["max"] == 1.1
    fault = figures["corrupt"]["llama3_1b_audit_corrupt"]
    assert fault["only_that_block"] and fault["origin_is_right"] and fault["hits"]["hits"] == 1
    cost = figures["cost"]["llama3_1b"]
    step_s = 8 * 2048 / 40_000  # configs/llama3_debug.toml: local batch 8 x seq 2048
    assert cost["train_step_s"] == pytest.approx(step_s)
    assert cost["audit_over_step"] == round(34.0 / step_s, 1)
    assert cost["audit_peak_gib"] == 30.0 and cost["peak_ratio"] == 0.75
    assert (cost["audit_tokens"], cost["train_tokens"]) == (4096, 8 * 2048)
    first = figures["first_step"]
    assert first["losses_equal"] and first["steps_compared"] == [1, 2, 3]
    assert first["wall_s_extra"] == 15.0 and first["to_step1_s_extra"] == 9.0
    table = figures["table_vs_aten"]
    assert table["parameters"] == 9 and table["worst"] == "layers.2.w1"
    assert table["max"] == pytest.approx(3.0) and table["median"] == pytest.approx(1.0)
    assert table["verdicts"] == {"aten": "ok", "table": "ok"}
    assert table["loss_err_job"] == {"aten": 1e-5, "table": 1e-5}
    with pytest.raises(SystemExit) as stop:
        bench.main(["--reanalyse", str(tmp_path / "nothing")])
    assert stop.value.code == 2
    assert "not a stored result" in capsys.readouterr().err


REAL_LOG = (Path(__file__).resolve().parents[2] / "fixtures" / "logs"
            / "numerics_audit_cpu_corrupt_block1.log")
"""This benchmark's audit worker on CPU (a trial merge with the audit branch at ebaef05, torch
2.13, llama3 two blocks; DEBUG lines and local paths taken out)::

    PYTHONPATH=. TITAN_ROCM_BENCH_AUDIT_CHILD=1 \\
    TITAN_ROCM_DEBUG_CORRUPT=block=1,fraction=0.03 python benchmarks/numerics_audit.py \\
        --trainer tests.support.audit_trainer:AuditTrainer \\
        <tests/support/cpu_trainer.py BASE_ARGS> \\
        --model.converters rocm --compile.enable --json
"""


def test_a_real_corrupted_audit_log_is_judged_right() -> None:
    text = REAL_LOG.read_text()
    result = bench.audit_result(text)
    assert result is not None and result["schema"] == 1 and result["exit_code"] == 1
    verdict = bench.judge_corrupt(result, 1)
    assert verdict["flagged"] and verdict["origin"] == "layers.1" and verdict["origin_is_right"]
    assert verdict["worst_is_right"] and verdict["later_blocks_clean"]
    assert verdict["upstream_flagged"] == [0]  # block 1's input gradient carried it on
    assert bench.corrupt_summary(text)["hits"] == {
        "graphs": 1, "graphs_without_node": 0, "calls": 3, "hits": 1, "elements": 4096,
        "replaced": 123, "changed": 123}
    dist = bench.ratio_distribution(result)
    assert dist["worst"].startswith("layers.1.") and dist["max"] > 1000


