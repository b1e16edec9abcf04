"""titan-rocm compare: synthetic logs with known curves, the verdicts, exit codes, JSON, the
picture, and bad input."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.compare_logs import BASE, STEPS, curve, log_maker, noisy, repeats, tt_log
from titan_rocm.cli import main
from titan_rocm.logs.compare import compare, load_run, noise_band, relative, series_of
from titan_rocm.logs.parse import parse_file
from titan_rocm.logs.summary import summarize


@pytest.fixture
def logs(tmp_path: Path):
    return log_maker(tmp_path)


def run_json(capsys, *argv) -> tuple[int, dict]:
    code = main(["compare", "--json", *map(str, argv)])
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out  # strict JSON
    return code, json.loads(out)


# -- verdicts per class of curve ----------------------------------------------------------------


def test_identical_runs_are_within_noise(capsys, logs) -> None:
    code, data = run_json(capsys, logs("base", BASE), logs("same", BASE), *repeats(logs))
    (run,) = data["runs"]
    assert code == 0 and run["compare_verdict"] == "within noise" and data["qualified"]
    (rank,) = run["ranks"]
    assert rank["steps_in_common"] == STEPS
    assert rank["loss"]["max"]["pct"] == 0 and rank["loss"]["first_outside_band"] is None
    assert run["throughput"]["ratio"] == 1.0


@pytest.mark.parametrize("k", [1, 30, 70])
def test_offset_from_step_k_differs_from_step_k(capsys, logs, k: int) -> None:
    other = {s: v * (1.05 if s >= k else 1.0) for s, v in BASE.items()}
    code, data = run_json(capsys, logs("base", BASE), logs("other", other), *repeats(logs))
    (run,) = data["runs"]
    assert code == 1 and run["compare_verdict"] == f"differs from step {k}"
    assert run["first_outside"] == k
    assert run["ranks"][0]["loss"]["final"]["pct"] == pytest.approx(5.0, abs=1e-3)


def test_noise_within_the_band_is_within_noise(capsys, logs) -> None:
    code, data = run_json(capsys, logs("base", BASE), logs("other", noisy(7, 0.003)),
                          *repeats(logs, 3, 0.01))
    assert code == 0 and data["runs"][0]["compare_verdict"] == "within noise"


def test_noise_band_is_the_running_envelope_of_the_repeats() -> None:
    base = {1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0}
    reps = [{1: 10.0, 2: 10.2, 3: 10.0, 4: 9.7}, {1: 10.0, 2: 9.9, 3: 10.1}]
    assert relative(base, reps[0]) == pytest.approx({1: 0, 2: 0.02, 3: 0, 4: -0.03})
    # step 3: the repeats cross near the baseline, yet runs have been 2 % apart by then
    assert noise_band(base, reps, 0.001) == pytest.approx({1: 0.001, 2: 0.02, 3: 0.02, 4: 0.03})


def test_a_diverging_run_is_named_and_never_averaged_in(capsys, logs) -> None:
    bad = {s: (v if s < 40 else "nan") for s, v in BASE.items()}
    code, data = run_json(capsys, logs("base", BASE), logs("bad", bad), *repeats(logs))
    (run,) = data["runs"]
    assert code == 1 and run["compare_verdict"] == "diverged at step 40"
    assert run["throughput"]["ratio"] is None
    assert "the run diverged at step 40" in run["throughput"]["reason"]
    assert run["ranks"][0]["steps_in_common"] == STEPS  # curves drawn up to the divergence
    assert max(s["step"] for s in run["ranks"][0]["loss"]["per_step"]) == 30


def test_a_truncated_run_is_incomplete(capsys, logs) -> None:
    crashed = logs("crashed", {s: v for s, v in BASE.items() if s <= 50},
                   tail=["[rank0]: torch.OutOfMemoryError: HIP out of memory."])
    code, data = run_json(capsys, logs("base", BASE), crashed, *repeats(logs))
    assert code == 1 and data["runs"][0]["compare_verdict"] == "incomplete"
    # a log cut mid-line without a crash marker: compared over the steps it has
    cut = logs("cut", {s: v for s, v in BASE.items() if s <= 50})
    cut.write_text(cut.read_text() + "[titan] step: 60  loss:")
    code, data = run_json(capsys, logs("base", BASE), cut, *repeats(logs))
    assert code == 0 and data["runs"][0]["ranks"][0]["steps_in_common"] == STEPS[:6]


def test_multi_rank_logs_are_compared_per_rank(capsys, tmp_path) -> None:
    def two_ranks(name: str, rank1: dict[int, float]) -> Path:
        r0 = tt_log(tmp_path / "r0", BASE, rank=0).read_text()
        r1 = tt_log(tmp_path / "r1", rank1, rank=1).read_text()
        path = tmp_path / f"{name}.log"
        path.write_text("".join(a + "\n" + b for a, b in zip(
            r0.splitlines(), r1.splitlines(), strict=True)))
        return path

    base = two_ranks("base", BASE)
    reps = ["--noise", *(str(two_ranks(f"rep{i}", noisy(i, 0.01))) for i in range(3))]
    code, data = run_json(capsys, base, two_ranks("same", BASE), *reps)
    assert code == 0 and [r["rank"] for r in data["runs"][0]["ranks"]] == [0, 1]
    drifted = {s: v * (1.1 if s >= 50 else 1) for s, v in BASE.items()}
    code, data = run_json(capsys, base, two_ranks("drifted", drifted), *reps)
    (run,) = data["runs"]
    assert code == 1 and run["compare_verdict"] == "differs from step 50"
    by_rank = {r["rank"]: r["loss"]["first_outside_band"] for r in run["ranks"]}
    assert by_rank == {0: None, 1: 50}
    main(["compare", str(base), str(two_ranks("same2", BASE)), *reps])
    assert "ranks 0, 1: identical differences on every rank; shown once." in (
        capsys.readouterr().out)


def test_a_tagged_run_against_an_untagged_baseline_says_which_ranks(capsys, logs) -> None:
    base, other = logs("base", BASE), logs("other", BASE, rank=3)
    assert main(["compare", str(base), str(other)]) == 0
    out = capsys.readouterr().out
    assert "rank 3 against the baseline's lines without a rank prefix: 11 step(s)" in out


def test_without_repeats_the_verdict_is_unqualified(capsys, logs) -> None:
    other = {s: v * 1.2 for s, v in BASE.items()}
    code, data = run_json(capsys, logs("base", BASE), logs("other", other))
    (run,) = data["runs"]
    assert code == 0 and not data["qualified"] and run["compare_verdict"] == "unqualified"
    assert run["first_outside"] == 1
    main(["compare", str(logs("base", BASE)), str(logs("other", other))])
    out = capsys.readouterr().out
    assert "every verdict below is unqualified" in out
    assert "no repeat runs (--noise), so no noise band to judge by; the loss first differs " \
           "by more than the tolerance at step 1." in out


def test_an_invalid_repeat_is_left_out_and_named(capsys, logs) -> None:
    bad = logs("badrepeat", {s: (v if s < 20 else "nan") for s, v in BASE.items()})
    code, data = run_json(capsys, logs("base", BASE), logs("same", BASE), "--noise", bad)
    assert code == 1 and data["noise"]["excluded"] == ["repeat 1: badrepeat.log"]
    assert not data["qualified"] and data["runs"][0]["compare_verdict"] == "unqualified"


def test_throughput_ratio_is_bench_summary_median(capsys, logs, tmp_path) -> None:
    base, fast = logs("base", BASE, tps=40_000.0), logs("fast", BASE, tps=44_000.0)
    code, data = run_json(capsys, "--warmup", "20", base, fast)
    medians = [summarize([load_run(p, "x", warmup=20).log], warmup=20).stats["tps"].median
               for p in (base, fast)]
    assert data["runs"][0]["throughput"] == {
        "field": "tps", "ratio": medians[1] / medians[0], "median": medians[1],
        "baseline_median": medians[0], "reason": None}


def test_megatron_logs_use_iteration_time(capsys, tmp_path) -> None:
    def mg(name: str, ms: float) -> Path:
        path = tmp_path / name
        path.write_text("".join(
            f" iteration {s:8d}/     100 | elapsed time per iteration (ms): {ms} | "
            f"lm loss: {curve(s):.6E} | grad norm: 1.5 | number of nan iterations: 0 |\n"
            for s in STEPS[1:]))
        return path

    code, data = run_json(capsys, "--warmup", "10", mg("a.log", 1000.0), mg("b.log", 800.0))
    assert code == 0 and data["runs"][0]["throughput"]["field"] == "iteration_ms"
    assert data["runs"][0]["throughput"]["ratio"] == pytest.approx(1.25)


def test_labels_name_the_runs(capsys, logs) -> None:
    code, data = run_json(capsys, logs("a", BASE), logs("b", BASE), "--label", "stock",
                          "--label", "rocm")
    assert data["baseline"]["label"] == "stock" and data["runs"][0]["label"] == "rocm"


def test_text_report(capsys, logs) -> None:
    other = {s: v * (1.05 if s >= 30 else 1.0) for s, v in BASE.items()}
    code = main(["compare", str(logs("base", BASE)), str(logs("other", other)),
                 *repeats(logs, 1)])
    out = capsys.readouterr().out
    assert code == 1
    assert "noise band: from 1 repeat run of the baseline" in out
    assert "so a 'differs' verdict from it is weak; give more repeats." in out
    # default labels: the file names less what they share ("base.log", "other.log")
    assert "other (" in out and "): differs from step 30 (loss +5 % against a band of" in out
    assert out.rstrip().endswith("verdict: other: differs from step 30.")


# -- bad input: one line, exit 2 ------------------------------------------------------------------


BAD_CASES = ("one log", "missing", "directory", "no metric line", "empty repeat", "plot suffix",
             "plot dir", "labels", "same names", "size", "tolerance", "warmup")


def _bad_inputs(tmp_path: Path, good: Path) -> dict[str, tuple[list[str], str]]:
    empty = tmp_path / "empty.log"
    empty.write_text("hello\n")
    two = [str(good), str(tt_log(tmp_path / "other.log", BASE))]
    return {
        "one log": ([str(good)], "needs a baseline LOG and at least one other LOG"),
        "missing": ([str(good), str(tmp_path / "nope.log")], "No such file or directory"),
        "directory": ([str(good), str(tmp_path)], "it is a directory"),
        "no metric line": ([str(good), str(empty)], "no TorchTitan or Megatron-LM metric line"),
        "empty repeat": ([*two, "--noise", str(empty)], "no TorchTitan"),
        "plot suffix": ([*two, "--plot", str(tmp_path / "x.jpg")], "must end in .png or .svg"),
        "plot dir": ([*two, "--plot", str(tmp_path / "no" / "x.png")], "does not exist"),
        "labels": ([str(good), str(good), "--label", "a", "--label", "b", "--label", "c"],
                   "3 --label values for 2 LOG(s)"),
        "same names": ([str(good), str(good)], "the runs' names are not distinct"),
        "size": ([str(good), str(good), "--size", "10x10"],
                 "'10x10' is not valid; accepted: WIDTHxHEIGHT (e.g. 1200x1100), each an "
                 "integer >= 200 and <= 8000 (pixels)"),
        "tolerance": ([str(good), str(good), "--tolerance", "-1"],
                      "accepted: a number >= 0 and <= 1000000 (percent)"),
        "warmup": ([str(good), str(good), "--warmup", "x"], "an integer >= 0"),
    }


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_and_exit_2(capsys, logs, tmp_path, case: str) -> None:
    cases = _bad_inputs(tmp_path, logs("good", BASE))
    assert set(cases) == set(BAD_CASES)
    argv, said = cases[case]
    assert main(["compare", *argv]) == 2
    captured = capsys.readouterr()
    assert said in captured.err and "Traceback" not in captured.err + captured.out


def test_missing_matplotlib_is_one_line_and_exit_2(capsys, logs, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "x.png"
    code = main(["compare", str(logs("a", BASE)), str(logs("b", BASE)), "--plot", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert err == ("titan-rocm compare: --plot needs matplotlib, which is not installed; install "
                   "it with: pip install 'titan-rocm[plot]' (or pip install matplotlib).")


FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE_OK)
@given(st.lists(st.sampled_from([
    "step: 1  loss: 5.0  grad_norm: 1.0  tps: 10", "step: 10  loss: nan", "step: 20  loss: 4",
    "[rank1]:step: 10  loss: 3.0  grad_norm: inf", "Traceback (most recent call last):",
    "KeyError: ''", "step: 30  loss:", "tps: -1", "hello", "\x00\xff",
]) | st.text(max_size=15), max_size=12), st.lists(st.text(max_size=40), max_size=6))
def test_compare_never_raises(tmp_path_factory, capsys, a: list[str], b: list[str]) -> None:
    folder = tmp_path_factory.mktemp("c")
    paths = []
    for name, lines in (("a.log", a), ("b.log", ["step: 1  loss: 5.0", *b])):
        (folder / name).write_text("\n".join(lines), errors="surrogatepass")
        paths.append(str(folder / name))
    for extra in ([], ["--json"], ["--noise", paths[1]]):
        code = main(["compare", *paths, *extra])
        out = capsys.readouterr().out
        assert code in (0, 1, 2)
        if extra == ["--json"] and code != 2:
            assert "NaN" not in out and "Infinity" not in out
            json.loads(out)


def test_compare_api_on_runs(logs) -> None:
    base = load_run(logs("base", BASE), "base")
    c = compare(base, [load_run(logs("x", BASE), "x")], [load_run(logs("r", BASE), "r")])
    assert c.exit_code == 0 and c.runs[0].verdict == "within noise" and c.plot_rank is None
    with pytest.raises(ValueError, match="accepted: a number >= 0 and <= 1000000"):
        compare(base, [], [], tolerance_pct=float("nan"))


def test_the_picture_draws_each_curve_in_its_units(logs) -> None:
    """What each panel draws (no matplotlib needed): loss and grad norm as logged, the
    difference panel in percent for the runs and the repeats, the non-finite marker."""
    from titan_rocm.logs.plot import bands, curves

    base = load_run(logs("base", BASE), "base")
    offset = {s: v * (1.02 if s >= 30 else 1) for s, v in BASE.items()}
    bad = {s: (v if s < 90 else "nan") for s, v in BASE.items()}
    rep = load_run(logs("rep", noisy(3, 0.01)), "rep")
    c = compare(base, [load_run(logs("off", offset), "off"), load_run(logs("bad", bad), "bad")],
                [rep])
    drawn = {(k.panel, k.name): k for k in curves(c)}
    assert set(drawn) == {(p, n) for p in ("loss", "grad_norm", "difference")
                          for n in ("rep", "off", "bad")} | {("loss", "base"),
                                                             ("grad_norm", "base")}
    diff = drawn[("difference", "off")]
    assert dict(zip(diff.steps, diff.values, strict=True))[50] == pytest.approx(2.0, rel=1e-4)
    rep_diff = dict(zip(drawn[("difference", "rep")].steps, drawn[("difference", "rep")].values,
                        strict=True))
    logged = relative(base.series(None).loss, rep.series(None).loss)
    assert rep_diff == pytest.approx({s: 100 * d for s, d in logged.items()})
    assert max(map(abs, rep_diff.values())) > 0.2  # percent, not a fraction
    assert drawn[("loss", "bad")].first_nonfinite == 90
    assert math.isnan(dict(zip(drawn[("loss", "bad")].steps, drawn[("loss", "bad")].values,
                               strict=True))[90])
    assert drawn[("loss", "off")].label == "off: differs from step 30 (1.000x tokens/s, 37.7 GiB)"
    steps, low, high = bands(c)["difference"]
    assert high == [-x for x in low]
    assert max(high) == pytest.approx(max(map(abs, rep_diff.values())))


# -- lean reading: the same figures as every line kept --------------------------------------

FIXTURE_LOGS = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "logs").glob("*.log"))


def tt_line(step: int, loss: float, gn: str | None = "1.0", rank: int | None = None) -> str:
    prefix = f"[rank{rank}]:" if rank is not None else ""
    grad = f"  grad_norm: {gn}" if gn is not None else ""
    return (f"{prefix}step: {step:2d}  loss: {loss:.5f}{grad}  memory: 3.00GiB(2.00%)  "
            f"tps: {900 + step:,}  tflops: 1.00  mfu: 1.00%\n")


def _series_from_records(log, rank):
    """The curve as every record kept reads it: the first line of a step wins, per metric."""
    loss, grad_norm = {}, {}
    for r in log.records:
        if r.kind == "train" and r.rank == rank:
            if r.loss is not None:
                loss.setdefault(r.step, r.loss)
            if r.grad_norm is not None:
                grad_norm.setdefault(r.step, r.grad_norm)
    return loss, grad_norm


@pytest.mark.parametrize("path", FIXTURE_LOGS, ids=lambda p: p.name)
def test_lean_reading_gives_the_figures_of_every_line_kept(path: Path, tmp_path: Path) -> None:
    """compare and bench-summary read logs lean (a curve per rank in arrays, counts of each
    throughput value): every summary field and every curve equals what the records give. A
    restart (steps logged again, a grad norm only on the repeat) and two ranks interleaved
    in reverse are added to each fixture."""
    text = path.read_text(errors="replace")
    extra = ("".join(tt_line(s, 5 - s / 100, gn=None) for s in (3, 2, 1))
             + "".join(tt_line(s, 4.0, rank=r) for s in (2, 1) for r in (1, 0)))
    mixed = tmp_path / "mixed.log"
    mixed.write_text(text + "\n" + extra)
    for p in (path, mixed):
        full = parse_file(p)
        for warmup in (0, 1, 10):
            lean = parse_file(p, lean=True, warmup=warmup)
            summary = summarize([lean], warmup)
            assert repr(summary.to_dict()) == repr(summarize([full], warmup).to_dict())
            for name, stat in (summary.stats or {}).items():
                values = [v for r in full.records if r.kind == "train" and r.step > warmup
                          and (v := getattr(r, name)) is not None]
                assert (stat is None) == (not values)
                if stat is not None:  # statistics' own figures, from every line kept
                    assert (stat.median, stat.min, stat.max, stat.count) == (
                        statistics.median(values), min(values), max(values), len(values))
        for rank in {r.rank for r in full.records if r.kind == "train"}:
            got = series_of(lean, rank)
            want = _series_from_records(full, rank)
            assert repr([sorted(got.loss.items()), sorted(got.grad_norm.items())]) == repr(
                [sorted(want[0].items()), sorted(want[1].items())]), rank
