"""titan-rocm compare --plot: the picture exists, has the requested size, opens, shows its
input (pixels differ between inputs), marks non-finite steps, and is written atomically."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from compare_logs import BASE, log_maker, repeats

from titan_rocm.cli import main

mpl_image = pytest.importorskip("matplotlib.image", reason="the [plot] extra is not installed")


@pytest.fixture
def logs(tmp_path: Path):
    return log_maker(tmp_path)


def _draw(capsys, logs, tmp_path, name: str, other: dict, *extra: str) -> Path:
    out = tmp_path / name
    # the same labels for every input: only the data differ, not the layout
    code = main(["compare", str(logs("base", BASE)), str(logs(f"o_{name}", other)),
                 *repeats(logs, 2), "--plot", str(out), "--label", "base", "--label", "run",
                 *extra])
    assert code in (0, 1) and f"picture: {out}" in capsys.readouterr().out
    return out


def _panels(image) -> list[tuple[int, int]]:
    """(top, bottom) pixel rows of each axes frame: rows that are mostly dark lines."""
    dark = (image[:, :, :3].sum(axis=-1) < 0.5).mean(axis=1) > 0.3
    rows = [i for i in range(len(dark)) if dark[i] and not (i and dark[i - 1])]
    return list(zip(rows[0::2], rows[1::2], strict=False))


def test_png_has_the_requested_size_and_shows_the_input(capsys, logs, tmp_path) -> None:
    same = _draw(capsys, logs, tmp_path, "same.png", BASE, "--size", "640x480")
    offset = {s: v * (1.05 if s >= 20 else 1) for s, v in BASE.items()}
    differs = _draw(capsys, logs, tmp_path, "differs.png", offset, "--size", "640x480")
    for path in (same, differs):
        assert path.stat().st_size > 10_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    a, b = mpl_image.imread(same), mpl_image.imread(differs)
    assert a.shape[:2] == b.shape[:2] == (480, 640)
    changed = abs(a - b).sum(axis=-1) > 0.1
    panels = _panels(a)
    assert len(panels) == 3  # loss, grad norm, relative difference
    for top, bottom in panels:  # each panel shows its input (left half: not the legend)
        assert changed[top + 2: bottom - 1, : a.shape[1] // 2].mean() > 0.001, (top, bottom)
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file


def test_default_size_and_log_y(capsys, logs, tmp_path) -> None:
    plain = _draw(capsys, logs, tmp_path, "plain.png", BASE)
    log_y = _draw(capsys, logs, tmp_path, "logy.png", BASE, "--log-y")
    a, b = mpl_image.imread(plain), mpl_image.imread(log_y)
    assert a.shape[:2] == (1100, 1200) and (abs(a - b).sum(axis=-1) > 0.1).any()


def test_nonfinite_step_is_marked(capsys, logs, tmp_path) -> None:
    bad = {s: (v if s < 60 else "nan") for s, v in BASE.items()}
    clean = _draw(capsys, logs, tmp_path, "clean.svg", {s: v for s, v in BASE.items() if s < 60})
    marked = _draw(capsys, logs, tmp_path, "marked.svg", bad)
    text = marked.read_text()
    ET.fromstring(text)  # well-formed SVG
    assert "first non-finite" in text and "step 60" in text
    assert "first non-finite" not in clean.read_text()


def test_an_interrupted_plot_leaves_nothing(capsys, logs, tmp_path, monkeypatch) -> None:
    """Ctrl-C while the picture is written: no picture, no temporary file (the CLI's generic
    handler turns the KeyboardInterrupt into exit 130)."""
    import os

    real_fdopen = os.fdopen

    def interrupted(fd, *a, **k):
        handle = real_fdopen(fd, *a, **k)
        handle.write = lambda data: (_ for _ in ()).throw(KeyboardInterrupt)
        return handle

    monkeypatch.setattr(os, "fdopen", interrupted)
    out = tmp_path / "x.png"
    code = main(["compare", str(logs("a", BASE)), str(logs("b", BASE)), "--plot", str(out)])
    assert code == 130 and capsys.readouterr().err.endswith("titan-rocm compare: interrupted\n")
    assert not out.exists() and not list(tmp_path.glob(".*"))


