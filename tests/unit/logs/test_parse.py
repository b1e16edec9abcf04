"""titan_rocm.logs.parse: TorchTitan and Megatron-LM metric lines inside messy real logs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from titan_rocm.logs.check import check_parsed
from titan_rocm.logs.parse import json_value, parse_file, parse_text, to_float
from titan_rocm.logs.summary import summarize

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
E = "\x1b"

# One TorchTitan 0.2.2 line as MetricsProcessor.log prints it with colours (see fixtures).
TT = (
    f"{E}[31mstep: 12  {E}[32mloss:  7.12340  {E}[38;2;180;60;0mgrad_norm:  1.2345  "
    f"{E}[38;2;54;234;195mmemory: 12.34GiB(8.80%)  {E}[34mtps: 1,234  {E}[36mtflops: 1,056.78  "
    f"{E}[35mmfu: 5.74%{E}[39m"
)
MG = (
    " [2025-06-01 10:00:00] iteration       12/     100 | consumed samples:          384 |"
    " elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 456.7 |"
    " learning rate: 1.000000E-04 | global batch size:    32 | lm loss: 7.123456E+00 |"
    " loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 |"
    " number of nan iterations:   0 |"
)


def one(text: str, fmt: str = "auto"):
    log = parse_text(text, fmt)
    assert len(log.records) == 1, log.records
    return log.records[0]


def test_torchtitan_line_every_field() -> None:
    r = one(f"[titan] 2025-06-01 10:00:00,123 - root - INFO - {TT}")
    assert (r.format, r.kind, r.step, r.rank) == ("torchtitan", "train", 12, None)
    assert (r.loss, r.grad_norm, r.memory_gib) == (7.1234, 1.2345, 12.34)
    assert (r.tps, r.tflops, r.mfu) == (1234.0, 1056.78, 5.74)
    assert r.finite


def test_megatron_line_every_field() -> None:
    r = one(MG)
    assert (r.format, r.step, r.losses) == ("megatron", 12, (("lm loss", 7.123456),))
    assert (r.grad_norm, r.tflops, r.iteration_ms, r.nan_iterations) == (1.234, 456.7, 1234.5, 0)
    assert r.finite  # "loss scale: 1.0" is not a loss


@pytest.mark.parametrize(
    ("text", "loss", "gn"),
    [
        ("step: 3  loss: nan  grad_norm: 1.0", "nan", 1.0),
        ("step: 3  loss: NaN  grad_norm: 1.0", "nan", 1.0),
        ("step: 3  loss: -nan  grad_norm: 1.0", "nan", 1.0),
        ("step: 3  loss:      inf  grad_norm: -inf", "inf", "-inf"),
        ("step: 3  loss: Infinity  grad_norm: -Infinity", "inf", "-inf"),
        ("step: 3  loss: 1.0E+01  grad_norm: 2.5e-3", 10.0, 0.0025),
        ("step: 3  loss: 7.5,  grad_norm: 1.5, tps: 9", 7.5, 1.5),
        ("step: 3  loss: 7.5|grad_norm: 1.5|", 7.5, 1.5),
    ],
)
def test_torchtitan_value_spellings(text: str, loss, gn) -> None:
    r = one(text)
    for got, want in ((r.loss, loss), (r.grad_norm, gn)):
        if want == "nan":
            assert math.isnan(got)
        else:
            assert got == (float(want) if isinstance(want, str) else want)


@pytest.mark.parametrize(
    ("field", "value"),
    [("lm loss", "nan"), ("lm loss", "NaN"), ("lm loss", "-inf"), ("grad norm", "inf"),
     ("grad norm", "Infinity"), ("lm loss", "1.0E+01")],
)
def test_megatron_value_spellings(field: str, value: str) -> None:
    text = MG.replace(f"{field}: 7.123456E+00" if field == "lm loss" else f"{field}: 1.234",
                      f"{field}: {value}")
    r = one(text)
    got = r.loss if field == "lm loss" else r.grad_norm
    assert (math.isnan(got) and "nan" in value.lower()) or got == float(value)
    assert r.finite is math.isfinite(got)


@pytest.mark.parametrize(
    ("prefix", "rank"),
    [("[rank3]:", 3), ("[default5]:", 5), ("7: ", 7), ("[rank12]:[titan] 2025-06-01 - ", 12),
     ("2025-06-01T10:00:00.123Z ", None)],
)
def test_rank_and_timestamp_prefixes(prefix: str, rank: int | None) -> None:
    assert one(prefix + TT).rank == rank
    assert one(prefix + MG).rank == rank


def test_two_ranks_interleaved_on_one_physical_line() -> None:
    line = f"[rank0]:{TT}[rank1]:{TT.replace('loss:  7.12340', 'loss:      nan')}"
    log = parse_text(line + "\n" + f"[rank1]:{MG}")
    ranks_losses = [(r.rank, r.format, r.loss) for r in log.records]
    assert ranks_losses[0] == (0, "torchtitan", 7.1234)
    assert ranks_losses[1][:2] == (1, "torchtitan") and math.isnan(ranks_losses[1][2])
    assert ranks_losses[2] == (1, "megatron", 7.123456)


def test_windows_line_ends_and_truncated_last_line() -> None:
    text = "\r\n".join([TT, TT.replace("step: 12", "step: 13"), "step: 14  loss:"])
    log = parse_text(text)
    assert [r.step for r in log.records] == [12, 13]
    assert log.truncated == [3]


def test_truncated_mid_number_keeps_what_is_there() -> None:
    r = one("step: 9  loss:  7.12")
    assert r.loss == 7.12 and r.grad_norm is None


def test_validation_and_unrelated_step_mentions() -> None:
    log = parse_text(
        "validate step: 20  loss:  6.9876  memory: 1.00GiB(1.00%)  tps: 5,000\n"
        "Profiling active at step: 5\n"
        " validation loss at iteration 100 on validation set | lm loss value: 7.1E+00 |"
        " lm loss PPL: 1.2E+03 |\n"
    )
    assert [(r.format, r.kind, r.step, r.loss) for r in log.records] == [
        ("torchtitan", "validation", 20, 6.9876), ("megatron", "validation", 100, 7.1)]


def test_megatron_extra_losses_tokens_and_memory() -> None:
    text = MG.replace(" lm loss:", " load_balancing_loss: inf | lm loss:").replace(
        " learning rate", " tokens per GPU (tokens/s/GPU): 9640.7 | learning rate")
    text += "\n[Rank 0] (after 10 iterations) memory (MB) | allocated: 1024.0 | max allocated:"
    text += " 2048.0 | reserved: 3072.0 | max reserved: 4096.0"
    log = parse_text(text)
    (r,) = log.records
    assert r.losses[0] == ("lm loss", 7.123456) and r.losses[1][0] == "load_balancing_loss"
    assert not r.finite and r.tps == 9640.7
    assert log.memory_peaks_gib == [4.0]


def test_megatron_nan_iteration_count_is_a_failure() -> None:
    r = one(MG.replace("number of nan iterations:   0", "number of nan iterations:   2"))
    assert r.bad_values() == {"number of nan iterations": 2.0}


def test_guard_stop_message_is_a_failure_record() -> None:
    log = parse_text(
        "[rank0]: titan_rocm.workarounds.divergence_guard.verdict.DivergenceError: titan-rocm "
        "divergence guard: training diverged at step 7 (first seen on rank 1): loss = nan, "
        "grad_norm = 1.5; rank 0 logged the likely causes"
    )
    (r,) = log.records
    assert (r.kind, r.step, r.rank, r.grad_norm) == ("guard", 7, 1, 1.5) and not r.finite
    assert log.format is None  # a guard message is not a log format


def test_format_restriction() -> None:
    assert parse_text(TT, "megatron").records == []
    assert parse_text(MG, "torchtitan").records == []
    with pytest.raises(ValueError, match="accepted: auto, torchtitan, megatron"):
        parse_text(TT, "csv")


def test_to_float_and_json_value() -> None:
    assert to_float("1,234.5") == 1234.5
    assert json_value(float("-inf")) == "-inf" and json_value(2.0) == 2.0


# -- real TorchTitan logs (tests/fixtures/logs/generate_torchtitan.sh) ----------------------


def test_real_clean_log_with_ansi_colours() -> None:
    for name in ("tt_cpu_clean.log", "tt_cpu_clean_nocolor.log"):
        log = parse_file(FIXTURES / name)
        assert [r.step for r in log.records] == [1, 5, 10, 15, 20], name
        assert all(r.finite and r.tps and r.memory_gib for r in log.records)


def test_real_diverged_log_without_guard() -> None:
    log = parse_file(FIXTURES / "tt_cpu_diverged_no_guard.log")
    assert [r.step for r in log.records] == list(range(1, 13))
    assert [r.step for r in log.records if not r.finite] == list(range(3, 13))
    assert "Training completed" in (FIXTURES / "tt_cpu_diverged_no_guard.log").read_text()


def test_real_two_rank_log() -> None:
    log = parse_file(FIXTURES / "tt_cpu_2rank_guard_nan_step7_rank1.log")
    assert log.ranks == [0, 1]
    train = {(r.rank, r.step): r for r in log.train_records}
    assert sorted(train) == [(0, 1), (0, 10), (1, 1), (1, 10)]
    assert math.isnan(train[(1, 10)].grad_norm) and train[(0, 10)].grad_norm > 0
    guard = [r for r in log.records if r.kind == "guard"]
    assert guard and {r.step for r in guard} == {7}


def test_messy_fixture() -> None:
    log = parse_file(FIXTURES / "messy_torchtitan_crlf.log")
    assert log.ranks == [0, 1]
    got = [(r.rank, r.kind, r.step) for r in log.records]
    assert got == [
        (0, "train", 1), (1, "train", 1), (0, "train", 10), (1, "train", 10),
        (0, "validation", 20), (1, "train", 20), (0, "train", 20), (0, "train", 30),
        (1, "train", 30), (0, "train", 40), (1, "train", 40),
    ]
    by = {(r.rank, r.step, r.kind): r for r in log.records}
    assert by[(0, 10, "train")].tps == 10123.0
    assert math.isnan(by[(1, 20, "train")].loss) and by[(1, 20, "train")].grad_norm == math.inf
    assert by[(0, 20, "train")].grad_norm == 10.0 and by[(0, 20, "train")].finite
    assert by[(0, 30, "train")].loss == -math.inf


# -- never raise on any text ------------------------------------------------------------------

FRAGMENTS = st.sampled_from([
    "step:", " step: 1", "loss:", " nan", "NaN", "-inf", "Infinity", "1.0E+01", "1,234", "|",
    ",", "grad_norm:", "tps:", "tflops:", "mfu:", "%", "GiB(", "validate ", "iteration ", "/",
    " lm loss:", " grad norm:", "number of nan iterations:", "memory (MB) |", "max reserved:",
    "[rank0]:", "[default12]:", "3: ", "\x1b[31m", "\x1b[38;2;1;2;3m", "\r\n", "\n", "\r", " ",
    "9" * 30, "9" * 5000, ".", "e+", "E-999", "titan-rocm divergence guard: training diverged "
    "at step ", "loss = ", ", grad_norm = ", "\x00", "\ufffd", "tokens/s/GPU):",
])


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parsers_never_raise_on_arbitrary_text(text: str) -> None:
    _never_raise(text)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=5)), max_size=40).map("".join))
def test_parsers_never_raise_on_metric_like_text(text: str) -> None:
    _never_raise(text)


def _never_raise(text: str) -> None:
    for fmt in ("auto", "torchtitan", "megatron"):
        log = parse_text(text, fmt)
        result = check_parsed(log)
        assert result.exit_code in (0, 1, 2)
        json.dumps(result.to_dict(), allow_nan=False)
        result.lines()
        summary = summarize([log], warmup=1)
        json.dumps(summary.to_dict(), allow_nan=False)
        summary.lines()


@pytest.mark.parametrize("world_size", [1, 4])
@pytest.mark.parametrize(
    "loss, grad_norm", [(float("nan"), 1.5), (2.25, float("inf")), (None, float("-inf"))]
)
def test_guard_messages_round_trip_through_the_parser(world_size, loss, grad_norm) -> None:
    """What the guard writes (both messages) is what the log tools recognise: one owner."""
    from titan_rocm.guard_message import Divergence, message, short_message

    d = Divergence(step=7, rank=world_size - 1, loss=loss, grad_norm=grad_norm,
                   checked_at="log step 10", world_size=world_size,
                   ranks_bad=tuple(range(world_size)))
    for text in (message(d), short_message(d)):
        (r,) = parse_text(text).records
        assert (r.kind, r.step, r.guard_stop) == ("guard", 7, True)
        assert r.rank == (d.rank if world_size > 1 else None)
        assert (r.loss is None) == (loss is None)
        if loss is not None:
            assert str(r.loss) == str(loss)
        assert str(r.grad_norm) == str(grad_norm)
        assert not r.finite
