"""titan-rocm compare --plot: the picture exists, has the requested size, opens, shows its
input (pixels differ between inputs), marks non-finite steps, and is written atomically; the
difference panel is the main one and marks the first step outside the band; steps are
integers; the legend carries throughput and memory and tells the marks' story (issue 25,
item 7)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support.compare_logs import BASE, log_maker, repeats
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
    assert len(panels) == 3  # relative difference (the main panel), loss, grad norm
    heights = [bottom - top for top, bottom in panels]
    assert heights[0] > 1.5 * max(heights[1:])
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
    assert "run: diverged at step 60" in text  # the mark says what the legend says
    assert "diverged at step" not in clean.read_text()


# -- what the picture says (read from the matplotlib Figure itself) ------------------------------

def _figure(logs, other: dict, *, n_repeats: int = 2, **kw):
    from titan_rocm.logs.compare import compare, load_run
    from titan_rocm.logs.plot import PANELS, figure

    paths = [logs("base", BASE), logs("run", other, **kw)]
    noise = repeats(logs, n_repeats)[1:] if n_repeats else []
    runs = [load_run(p, name) for p, name in zip(paths, ("base", "run"), strict=True)]
    rep = [load_run(p, f"repeat {i}") for i, p in enumerate(noise)]
    fig = figure(compare(runs[0], runs[1:], rep))
    return fig, dict(zip(PANELS, fig.axes, strict=False))


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_the_first_step_outside_the_band_is_marked_on_the_main_panel(logs) -> None:
    offset = {s: v * (1.05 if s >= 30 else 1) for s, v in BASE.items()}
    fig, axes = _figure(logs, offset)
    assert "first outside the band: step 30" in _texts(axes["difference"])
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    run = next(x for x in labels if x.startswith("run: "))
    # the verdict, the throughput ratio and the memory peak, in the legend
    assert run.startswith("run: differs from step 30 (") and "x tokens/s" in run \
        and "37.7 GiB" in run
    assert any(x.startswith("baseline: base (") and "tokens/s" in x for x in labels)


def test_steps_are_integers_and_log_y_ticks_are_plain_numbers(logs) -> None:
    from titan_rocm.logs.compare import compare, load_run
    from titan_rocm.logs.plot import figure

    few = {1: 8.0, 5: 7.0, 10: 6.5}  # a short run: matplotlib alone would tick 2.5, 7.5
    a, b = logs("a", few), logs("b", {s: v * 1.01 for s, v in few.items()})
    fig = figure(compare(load_run(a, "a"), [load_run(b, "b")], []), log_y=True)
    fig.canvas.draw()
    ax_rel, ax_loss, ax_gn = fig.axes
    ticks = [t for t in ax_gn.get_xticks() if ax_gn.get_xlim()[0] <= t <= ax_gn.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    labels = [t.get_text() for t in ax_loss.get_yticklabels() if t.get_text()]
    assert labels and not any("times" in x or "^" in x for x in labels), labels


def test_a_guard_stop_is_one_story_in_legend_and_mark() -> None:
    """A real CPU run the guard stopped at step 7, found at log step 10: the mark says
    'diverged at step 7' as the legend does, and names step 10 as where the log shows it."""
    from titan_rocm.logs.compare import compare, load_run
    from titan_rocm.logs.plot import figure

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
    base = load_run(fixtures / "tt_cpu_clean.log", "clean")
    run = load_run(fixtures / "tt_cpu_guard_nan_step7.log", "run")
    fig = figure(compare(base, [run], [load_run(fixtures / "tt_cpu_clean_nocolor.log", "r")]))
    (legend,) = fig.legends
    label = next(t.get_text() for t in legend.get_texts() if t.get_text().startswith("run: "))
    notes = [x for x in _texts(fig.axes[0]) if x.startswith("run: ")]
    assert label.startswith("run: diverged at step 7 ") and len(notes) == 1, (label, notes)
    assert notes[0] == "run: diverged at step 7\n(first non-finite value logged at step 10)"


def test_no_difference_to_draw_is_said_not_shown_as_an_empty_band(logs) -> None:
    dead = {1: BASE[1], 10: "nan"}
    fig, axes = _figure(logs, dead)
    ax = axes["difference"]
    assert any(x.startswith("no loss difference to draw") for x in _texts(ax))
    assert not ax.collections  # no band drawn


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


