"""Every numeric option of every command goes through the one validator
(:mod:`titan_rocm.numbers`): NaN, infinities, absurd and out-of-range values are refused with
the accepted range (exit 2), and nothing runs or is written."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titan_rocm import cli
from titan_rocm.numbers import RANKS, Bounds, refusal


def _options() -> Iterator[tuple[list[str], argparse.Action]]:
    """(command words, action) of every option of every command, sub-actions included."""
    def walk(words: list[str], parser: argparse.ArgumentParser) -> Iterator[tuple]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk([*words, name], sub)
            elif action.option_strings:
                yield words, action

    for name in cli.SUBCOMMANDS:
        yield from walk([name], cli._parser_for(name))


NUMBER_METAVARS = {"N", "S", "PCT", "K", "WxH", "SECONDS", "STEPS", "COUNT"}
"""Metavars that say an option takes a number."""


def _numeric(action: argparse.Action) -> bool:
    """Whether ``action`` takes a number: its type (a Bounds' parser, int, float), its
    default, or its metavar says so."""
    kind = action.type
    number = (int, float)
    default = action.default
    defaults = default if isinstance(default, tuple) else (default,)
    return (hasattr(kind, "bounds") or kind in number
            or getattr(kind, "__name__", "") in ("int", "float")
            or any(isinstance(d, number) and not isinstance(d, bool) for d in defaults)
            or action.metavar in NUMBER_METAVARS)


NUMERIC = [(w, a.option_strings[0], a.type) for w, a in _options() if _numeric(a)]


def test_every_numeric_option_uses_the_one_validator() -> None:
    """A ``type=float`` / ``type=int`` option would let NaN or 10**20 through, and one read
    as text and checked by hand later (``--tokens N`` parsed in ``run``) would refuse in a
    sentence of its own: each must carry its :class:`Bounds` (``Bounds.arg``)."""
    names = {f"{' '.join(w)} {o}" for w, o, _ in NUMERIC}
    # tune run x4, tune table, compare x3, bench-summary, plan x3, audit x2
    assert {"tune run --gpus", "compare --size", "audit --tokens",
            "audit --reference-chunks", "plan --world-size"} <= names, names
    assert len(NUMERIC) >= 14
    plain = [(w, o) for w, o, t in NUMERIC if not isinstance(getattr(t, "bounds", None), Bounds)]
    assert plain == [], f"numeric options without titan_rocm.numbers.Bounds: {plain}"


@pytest.mark.parametrize("kind", [None, int, float])
def test_the_enumeration_finds_an_option_validated_by_hand(kind: type | None) -> None:
    """The test above can fail: an option read as text (metavar N) or with a plain numeric
    type is found, and it has no Bounds."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", metavar="N", type=kind)
    parser.add_argument("--rate", type=kind, default=0.5)
    parser.add_argument("--ok", type=RANKS.arg("--ok"))
    found = {a.option_strings[0]: a for a in parser._actions if _numeric(a)}
    assert set(found) == {"--steps", "--rate", "--ok"}
    assert [o for o, a in found.items() if not hasattr(a.type, "bounds")] == ["--steps", "--rate"]


def _bounds(kind: object) -> Bounds:
    return kind.bounds  # type: ignore[attr-defined]


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
                  "compare": ["a.log", "b.log"], "bench-summary": ["a.log"], "plan": [],
                  "audit": []}
    argv = [*words, *positional[words[-1]], f"{option}={text}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    # One shape: "argument OPTION: VALUE is not valid; accepted: ...", naming the range.
    assert re.search(rf"argument {re.escape(option)}(/\S+)?: {re.escape(repr(text))} is not "
                     r"valid; accepted: ", err), err
    assert bounds.accepted() in err, err
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


@pytest.mark.parametrize(("flag", "accepted"), [
    ("--parallelism.tensor_parallel_degree=" + "1" + "0" * 20, "an integer"),
    ("--parallelism.data_parallel_shard_degree=-" + "9" * 20, "-1 or an integer"),
    ("--parallelism.expert_parallel_degree=2000000", "an integer")])
def test_plan_refuses_absurd_parallel_degrees_with_the_range(
        flag: str, accepted: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "llama3_debug.toml"
    assert cli.main(["plan", "--job.config_file", str(config), flag]) == 2
    err = capsys.readouterr().err
    key, _, value = flag.removeprefix("--parallelism.").partition("=")
    assert f"[parallelism] {key} = {value} is not valid; accepted: {accepted} >= 1 and <= " \
        "1048576" in err, err


def test_one_sentence_shape_for_typed_values_lists_and_extra_values() -> None:
    ranks = Bounds(int, 1, 8, also=(-1,))
    assert ranks.accepted() == "-1 or an integer >= 1 and <= 8"
    assert ranks.parse("-1", "--n") == -1 and ranks.check(8, "--n") == 8
    with pytest.raises(ValueError, match=r"^--n -2 is not valid; accepted: -1 or an integer"):
        ranks.check(-2, "--n")
    # A value a parser already typed: a bool, a string or a float is no integer.
    for bad in (True, "2", 2.0, None):
        with pytest.raises(ValueError, match=rf"^x = {re.escape(repr(bad))} is not valid; "):
            ranks.check(bad, "x =")
    assert Bounds(float, 0, 1).check(1, "x =") == 1  # an int is a float's value too
    pixels = Bounds(int, 200, 8000)
    assert pixels.parse_many("1200X1100", "--size", sep="x", form="WxH", count=2) == (1200, 1100)
    for bad in ("1200", "1200x1100x5", "100x1100", "x", "1200xnan"):
        with pytest.raises(ValueError, match=rf"^--size '{bad}' is not valid; accepted: WxH, "
                                             r"each an integer >= 200 and <= 8000$"):
            pixels.parse_many(bad, "--size", sep="x", form="WxH", count=2)
    indices = Bounds(int, 0, 3)
    assert indices.parse_many(" all ", "--gpus", sep=",", form="F", words=("all",)) == "all"
    assert indices.parse_many("2,0", "--gpus", sep=",", form="F", distinct=True) == (2, 0)
    with pytest.raises(ValueError, match=r"^--gpus '0,0' is not valid; accepted: F, each an "):
        indices.parse_many("0,0", "--gpus", sep=",", form="F", distinct=True)
    assert refusal("[rocm] k =", "v", "a, b") == "[rocm] k = 'v' is not valid; accepted: a, b"


def test_every_numeric_setting_has_its_range() -> None:
    """No numeric ``[rocm]`` setting falls back to a range nobody chose."""
    from dataclasses import fields

    from titan_rocm.settings import NUMBERS, RocmSettings

    numeric = {f.name for f in fields(RocmSettings) if f.type in (int, float, "int", "float")}
    assert numeric and set(NUMBERS) == numeric
    for name in numeric:
        assert NUMBERS[name].kind is type(getattr(RocmSettings(), name)), name


def test_tune_run_gpus_name_this_machines_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from titan_rocm.tuner.runner import RunError, device_slots

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device_slots("all") == ["0", "1"] and device_slots((1,)) == ["1"]
    with pytest.raises(RunError, match=r"^--gpus '0,2' is not valid; accepted: all, or device "
                                       r"indices separated by commas, each once, each an "
                                       r"integer >= 0 and <= 1$"):
        device_slots((0, 2))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_slots("all") == [None]
    with pytest.raises(RunError, match=r"^--gpus '0' is not valid; accepted: all \(this "
                                       r"machine has no GPU"):
        device_slots("0")
