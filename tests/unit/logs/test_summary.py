"""titan-rocm bench-summary: publishable figures only for a finite run."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from titan_rocm.cli import main
from titan_rocm.logs.parse import parse_file
from titan_rocm.logs.summary import summarize

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["bench-summary", "--json", *map(str, argv)])
    return code, json.loads(capsys.readouterr().out)


def test_real_clean_torchtitan_run(capsys) -> None:
    path = FIXTURES / "tt_cpu_clean.log"
    code, data = run_json(capsys, path)
    records = [r for r in parse_file(path).records if r.step > 1]
    assert code == 0 and data["valid"] is True and data["reason"] is None
    assert (data["format"], data["steps_parsed"], data["steps_measured"]) == ("torchtitan", 5, 4)
    tps = [r.tps for r in records]
    assert data["tps"] == {"median": statistics.median(tps), "min": min(tps), "max": max(tps),
                           "count": 4}
    assert data["tflops"]["count"] == 4 and data["mfu"]["count"] == 4
    assert data["memory_peak_gib"] == max(r.memory_gib for r in parse_file(path).records)
    assert data["iteration_ms"] is None


def test_warmup_moves_the_window(capsys) -> None:
    code, data = run_json(capsys, "--warmup", "10", FIXTURES / "tt_cpu_clean.log")
    assert code == 0 and data["steps_measured"] == 2 and data["tps"]["count"] == 2
    code, data = run_json(capsys, "--warmup", "20", FIXTURES / "tt_cpu_clean.log")
    assert code == 2 and data["valid"] is False and "after warm-up" in data["reason"]
    assert data["tps"] is None


@pytest.mark.parametrize(
    "name", ["tt_cpu_diverged_no_guard.log", "tt_cpu_guard_nan_step7.log",
             "tt_cpu_2rank_guard_nan_step7_rank1.log", "h200_1gpu_guard_nan_step7.log",
             "h200_2gpu_fsdp_guard_nan_step7_rank1.log", "megatron_nan.log",
             "megatron_moe_inf_aux_loss.log", "messy_torchtitan_crlf.log"],
)
def test_a_diverged_run_never_gets_a_throughput_figure(capsys, name: str) -> None:
    code, data = run_json(capsys, FIXTURES / name)
    assert code == 1 and data["valid"] is False and "the run diverged at step" in data["reason"]
    assert data["verdict"]["status"] == "diverged"
    assert all(data[k] is None for k in ("tps", "tflops", "mfu", "iteration_ms"))
    assert data["memory_peak_gib"] is None and data["first_bad"] is not None


def test_megatron_clean_run(capsys) -> None:
    code, data = run_json(capsys, FIXTURES / "megatron_clean.log")
    assert code == 0 and data["format"] == "megatron"
    assert data["tflops"] == {"median": 508.5, "min": 401.2, "max": 510.3, "count": 4}
    assert data["iteration_ms"]["median"] == pytest.approx(1209.35)
    assert data["memory_peak_gib"] == 60.0 and data["tps"] is None


def test_nothing_parsed_is_invalid(capsys, tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("hello\n")
    code, data = run_json(capsys, log)
    assert code == 2 and data["valid"] is False and "no TorchTitan" in data["reason"]
    code, data = run_json(capsys, tmp_path / "missing.log")
    assert code == 2 and "cannot read" in data["reason"]
    assert data["files"] == [str(tmp_path / "missing.log")]


def test_per_rank_files_are_pooled(capsys, tmp_path: Path) -> None:
    lines = (FIXTURES / "tt_cpu_clean_nocolor.log").read_text().splitlines()
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.log").write_text(
            "\n".join(f"[rank{rank}]:{ln}" for ln in lines))
    code, data = run_json(capsys, tmp_path / "rank0.log", tmp_path / "rank1.log")
    assert code == 0 and data["ranks"] == [0, 1] and data["tps"]["count"] == 8
    assert len(data["files"]) == 2


def test_text_report(capsys) -> None:
    assert main(["bench-summary", str(FIXTURES / "tt_cpu_clean.log")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("valid: true\nverdict: ok\n") and "tokens/s per device: median" in out
    assert main(["bench-summary", str(FIXTURES / "tt_cpu_diverged_no_guard.log")]) == 1
    out = capsys.readouterr().out
    assert out.startswith(
        "valid: false\nverdict: diverged at step 3\nreason: the run diverged at step 3 (line 11)")
    assert "tokens/s" not in out


@pytest.mark.parametrize("bad", ["-1", "two"])
def test_bad_warmup(capsys, bad: str) -> None:
    assert main(["bench-summary", "--warmup", bad, str(FIXTURES / "tt_cpu_clean.log")]) == 2
    assert f"argument --warmup: {bad!r} is not valid; accepted: an integer >= 0 and <= " \
        in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^--warmup -1 is not valid; accepted: an integer >= 0"):
        summarize([], warmup=-1)


@pytest.mark.parametrize("field", ["tps", "tflops", "mfu", "memory"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5"])
def test_a_non_finite_or_negative_figure_is_never_published(capsys, tmp_path, field, value):
    """Any throughput or memory figure that is not a finite number >= 0, at any step."""
    fields = {"tps": "tps: 1,000", "tflops": "tflops: 10.0", "mfu": "mfu: 5.0%",
              "memory": "memory: 3.0GiB(2.0%)"}
    lines = []
    for step in (1, 10, 20):
        figures = dict(fields)
        if step == 10:
            unit = {"memory": "GiB(2.0%)", "mfu": "%"}.get(field, "")
            figures[field] = f"{field}: {value}{unit}"
        lines.append(f"step: {step}  loss: 5.0  grad_norm: 1.0  " + "  ".join(figures.values()))
    log = tmp_path / "x.log"
    log.write_text("\n".join(lines) + "\n")
    code = main(["bench-summary", "--json", str(log)])
    out = capsys.readouterr().out
    data = json.loads(out)  # strict JSON: the parse fails on NaN / Infinity literals
    assert "NaN" not in out and "Infinity" not in out
    name = "memory_gib" if field == "memory" else field
    assert code == 1 and data["valid"] is False and data["verdict"]["status"] == "ok"
    assert data["reason"].startswith(f"{name} is {value} at train step 10 (line 2)")
    assert all(data[k] is None for k in ("tps", "tflops", "mfu", "iteration_ms"))


@pytest.mark.parametrize("value", ["nan", "inf", "-3"])
def test_megatron_non_finite_iteration_time_or_memory(capsys, tmp_path, value) -> None:
    text = (FIXTURES / "megatron_clean.log").read_text()
    for old in ("elapsed time per iteration (ms): 1210.8", "max reserved: 61440.0"):
        log = tmp_path / "m.log"
        log.write_text(text.replace(old, old.split(": ")[0] + ": " + value))
        code, data = run_json(capsys, log)
        assert code == 1 and data["valid"] is False, old
        assert "a non-finite or negative figure cannot be published" in data["reason"]
