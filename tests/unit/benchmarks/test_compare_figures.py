"""benchmarks/compare_figures.py: one command redraws the docs' stock-vs-rocm_on pictures from
the stored H200 logs, with the verdicts docs/performance.md quotes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")

REPO = Path(__file__).resolve().parents[3]
VERDICTS = {
    "llama3": "verdict: rocm_on (run 1): differs from step 10, rocm_on (run 2): differs from "
              "step 10.",
    "qwen3": "verdict: rocm_on (run 1): differs from step 20, rocm_on (run 2): within noise.",
    "deepseek_v3": "verdict: rocm_on (run 1): differs from step 10, rocm_on (run 2): differs "
                   "from step 10.",
}


@pytest.mark.slow
def test_one_command_redraws_every_picture(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare_figures", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    for name, verdict in VERDICTS.items():
        picture = tmp_path / f"compare-{name}.png"
        assert 20_000 < picture.stat().st_size < 200_000, name
        assert verdict in run.stdout, name
        committed = REPO / "docs" / "images" / picture.name
        assert 20_000 < committed.stat().st_size < 200_000, name
