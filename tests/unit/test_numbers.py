"""Every numeric option of every command goes through the one validator
(:mod:`titan_rocm.numbers`): NaN, infinities, absurd and out-of-range values are refused with
the accepted range (exit 2), and nothing runs or is written."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titan_rocm import cli
from titan_rocm.numbers import RANKS, Bounds


def _numeric_options() -> Iterator[tuple[list[str], str, Bounds]]:
    """(command words, option, bounds) of every option of every command with a type."""
    def walk(words: list[str], parser: argparse.ArgumentParser) -> Iterator[tuple]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk([*words, name], sub)
            elif action.type is not None and action.option_strings:
                yield words, action.option_strings[0], action.type

    for name in cli.SUBCOMMANDS:
        yield from walk([name], cli._parser_for(name))


NUMERIC = [(w, o, t) for w, o, t in _numeric_options()
           if getattr(t, "__name__", "") in ("int", "float", "_tolerance", "warmup_arg")
           or hasattr(t, "bounds")]


def test_every_numeric_option_uses_the_one_validator() -> None:
    """A new ``type=float`` / ``type=int`` option would let NaN or 10**20 through."""
    assert len(NUMERIC) >= 9  # tune run x3, tune table, compare x2, bench-summary, plan x3
    plain = [(w, o) for w, o, t in NUMERIC if not hasattr(t, "bounds")
             and t.__name__ != "warmup_arg"]
    assert plain == [], f"numeric options without titan_rocm.numbers.Bounds: {plain}"


def _bounds(kind: object) -> Bounds:
    if hasattr(kind, "bounds"):
        return kind.bounds  # type: ignore[attr-defined]
    from titan_rocm.numbers import STEPS

    return STEPS  # warmup_arg delegates to STEPS


BAD = st.one_of(
    st.sampled_from(["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400", "1" + "0" * 20,
                     "", "abc", "0x10", "1_0"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def _refused(bounds: Bounds, text: str) -> bool:
    try:
        value = float(text) if bounds.kind is float else int(text, 10)
    except ValueError:
        return True
    in_range = math.isfinite(value) and value <= bounds.high and (
        value > bounds.low if bounds.low_open else value >= bounds.low)
    return not in_range


@pytest.mark.parametrize(("words", "option", "kind"), NUMERIC,
                         ids=[" ".join([*w, o]) for w, o, _ in NUMERIC])
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=BAD)
def test_bad_numbers_are_refused_with_the_accepted_range(
        words: list[str], option: str, kind: object, text: str,
        tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> None:
    bounds = _bounds(kind)
    if not _refused(bounds, text):
        return  # e.g. a finite float inside the range
    tmp = tmp_path_factory.mktemp("n")
    out = tmp / "out"
    positional = {"run": ["p.jsonl", "-o", str(out)], "table": ["r.jsonl", "-o", str(out)],
                  "compare": ["a.log", "b.log"], "bench-summary": ["a.log"], "plan": []}
    argv = [*words, *positional[words[-1]], f"{option}={text}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f": {text!r} is not valid; accepted: {bounds.accepted()}" in err, err
    assert f"argument {option}" in err
    assert "Traceback" not in err and not out.exists()


@given(st.integers(min_value=1, max_value=RANKS.high))
def test_a_rank_count_in_range_is_taken(value: int) -> None:
    assert RANKS.parse(str(value), "--world-size") == value


def test_tune_run_refuses_unknown_backends(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tune", "run", "p.jsonl", "-o", str(tmp_path / "r"), "--backends",
                     "NOPE"]) == 2
    err = capsys.readouterr().err
    assert "'NOPE' is not valid; accepted: a comma-separated list of ATEN, TRITON" in err
    assert cli.main(["tune", "run", "p.jsonl", "-o", str(tmp_path / "r"), "--backends",
                     "aten,"]) == 2


def test_settings_and_errors_name_the_range() -> None:
    with pytest.raises(ValueError, match=r"--fudge 'nan' is not valid; accepted: a number > 0"):
        Bounds(float, 0, 1000, low_open=True).parse("nan", "--fudge")
    assert Bounds(float, 0, 86400, low_open=True, unit="seconds").accepted() == \
        "a number > 0 and <= 86400 (seconds)"


@pytest.mark.parametrize("flag", ["--parallelism.tensor_parallel_degree=" + "1" + "0" * 20,
                                  "--parallelism.data_parallel_shard_degree=-" + "9" * 20,
                                  "--parallelism.expert_parallel_degree=2000000"])
def test_plan_refuses_absurd_parallel_degrees_with_the_range(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "llama3_debug.toml"
    assert cli.main(["plan", "--job.config_file", str(config), flag]) == 2
    err = capsys.readouterr().err
    assert "is not valid; accepted: an integer >= 1 and <= 1048576" in err, err
