"""``benchmarks/compile_beside_training.py``: the stored runs recomputed give the figures
docs/numerics-audit.md quotes for why the probed copies do not compile beside training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
STORED = ROOT / "benchmarks" / "results" / "2026-12-07-cpu" / "compile-beside-training"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.compile_beside_training", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_the_stored_runs_give_the_figures_the_docs_quote() -> None:
    done = _run("--reanalyse", str(STORED))
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    assert set(figures) == {"torch213.jsonl", "torch213-fullgraph.jsonl"}
    runs = list(figures.values())
    assert all(f["torch"] == ["2.13.0+cpu"] and f["runs"] == 3 for f in runs)
    assert [f["fullgraph"] for f in runs] == [[True], [False]]  # sorted by file name
    reads = [n for f in runs for n in f["is_compiling_reads"]]
    assert len(reads) == 6 and (min(reads), max(reads)) == (3, 23)  # every run saw it
    assert all(f["reads_each"] == [1500] for f in runs)
    assert sum(f["runs_params_differ"] for f in runs) == 4
    assert sum(f["runs_alone_twice_equal"] for f in runs) == 6
    errors = [e for f in runs for e in f["job_errors"]]
    assert errors == ["TypeError: _foreach_addcdiv_() received an invalid combination of "
                      "arguments - got (list, list, tuple, list), but expected one of:"]
    assert figures["torch213-fullgraph.jsonl"]["job_errors"] == []
    assert not any(f["thread_errors"] for f in runs)
    docs = " ".join((ROOT / "docs" / "numerics-audit.md").read_text().split())
    for quoted in ("in each of six runs the job's thread read `is_compiling()` as True (3 to 23 "
                   "of its 1,500 reads); in four its parameters",
                   "bit for bit the same in all six), and in one its optimizer step raised "
                   "(`TypeError: _foreach_addcdiv_() received an invalid combination of "
                   "arguments`"):
        assert quoted in docs


def test_reanalysing_a_directory_without_its_output_is_one_sentence(tmp_path: Path) -> None:
    done = _run("--reanalyse", str(tmp_path))
    assert done.returncode == 2
    assert "no *.jsonl of this benchmark there; accepted: a directory of its stored output" in (
        done.stderr)
    assert "Traceback" not in done.stderr
    bad = _run("--runs", "1")
    assert bad.returncode == 2 and "--runs 1 is not valid; accepted: an integer >= 2" in (
        bad.stderr)
