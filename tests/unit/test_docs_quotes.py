"""What the docs quote is what is true now: command output regenerated from the command
(TorchTitan 0.2.2's; tests/tt030/test_tt030_docs_quotes.py runs 0.3.0's), figures re-derived
from the stored results' logs, and every file of this repository a page names exists.

The markers are described in tests/support/docs_quotes.py. After a change to a command's
output, regenerate every quoted block with one command and review the diff:

    python tests/unit/test_docs_quotes.py --update
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
def test_every_link_finds_its_page_and_heading():
    assert not (broken := docs_quotes.broken_links()), "\n".join(broken)


def test_a_link_to_a_missing_heading_or_page_is_named(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## The `x` flag: 0.3.0 (new)\n\n## Top\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#the-x-flag-030-new) [ok](a.md#top-1) [ok](#here) [web](https://x.org/#y)\n"
        "# Here\n```\n[in code](a.md#nowhere)\n```\n"
        "[bad](a.md#measured-on-an-h200) [gone](c.md)\n")
    assert docs_quotes.broken_links([tmp_path / "b.md"]) == [
        f"{tmp_path / 'b.md'}:6: a.md#measured-on-an-h200 (no heading with that anchor)",
        f"{tmp_path / 'b.md'}:6: c.md (no such file)"]


LAYOUT_ENTRY = re.compile(r"^  (?P<dir>[a-z_]+)/ +(?P<text>.*)$")


def layout_misplaced() -> list[str]:
    """Each ``name.py`` README's layout lists in a ``titan_rocm/`` package's entry that is
    not in that package (a name with a ``/`` is read from ``titan_rocm/``)."""
    block = (REPO / "README.md").read_text().split("\ntitan_rocm/\n", 1)[1].split("```", 1)[0]
    entries: list[tuple[str, str]] = []
    for line in block.splitlines():
        if m := LAYOUT_ENTRY.match(line):
            entries.append((m.group("dir"), m.group("text")))
        elif line.startswith("   ") and entries:
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
        elif line and not line.startswith(" "):
            break  # configs/, docs/, tests/: the repository root, not the package
    wrong = []
    for folder, text in entries:
        for name in re.findall(r"[\w/]+\.py\b", text):
            base = REPO / "titan_rocm"
            found = (base / name).exists() if "/" in name else any(
                (base / folder).rglob(name))
            if not found:
                wrong.append(f"{name} (listed under {folder}/)")
    return wrong


def test_readme_layout_puts_each_module_in_its_package():
    assert not (wrong := layout_misplaced()), "\n".join(wrong)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))

from tests.support import docs_quotes  # noqa: E402
from tests.support.docs_quotes import (  # noqa: E402
    _OUTPUTS,
    expected_body,
    find_figures,
    find_quotes,
    parse_spec,
    reanalysed,
    update,
    value_at,
)

QUOTES = [q for q in find_quotes() if q.series == "0.2"]
FIGURES = find_figures()


def test_the_docs_quote_some_output_and_figures():
    assert len(QUOTES) >= 12  # a marker typo would silently drop a quote
    assert len(FIGURES) >= 180
    assert len(find_quotes()) > len(QUOTES)  # and some of TorchTitan 0.3.0's


@pytest.mark.parametrize("quote", QUOTES, ids=[q.name for q in QUOTES])
def test_quoted_output_is_what_the_command_prints(quote):
    pytest.importorskip("torchtitan")
    if quote.without_gpu and docs_quotes.has_gpu():
        pytest.skip("the block shows what a machine without a GPU prints")
    assert quote.body == expected_body(quote), (
        f"{quote.name} quotes `{quote.command}`, whose output changed: run "
        "`python tests/unit/test_docs_quotes.py --update` and review the diff")


@pytest.mark.parametrize("figure", FIGURES, ids=[f.where for f in FIGURES])
def test_quoted_figure_is_the_stored_results_own(figure):
    value = value_at(reanalysed(figure.folder), figure.path)
    assert figure.expected(value) == figure.number, (
        f"{figure.where} quotes {figure.number}; {figure.folder} re-analysed gives {value}")


def test_a_bad_marker_part_is_named():
    with pytest.raises(ValueError, match=r"part 'line 3' is not valid; accepted: from"):
        parse_spec('titan-rocm plan | line 3')
    with pytest.raises(ValueError, match="is not a titan-rocm or titan-rocm-train command"):
        parse_spec("ls -l")
    spec = parse_spec('titan-rocm plan | stderr | exit 2 | torchtitan 0.3 | from "x" | lines 1 '
                      '| without a GPU')
    assert (spec.stream, spec.exit_code, spec.series, spec.start_text, spec.lines,
            spec.without_gpu) == ("stderr", 2, "0.3", "x", 1, True)


def test_update_rewrites_a_stale_block(tmp_path, monkeypatch):
    doc = tmp_path / "page.md"
    doc.write_text('intro\n<!-- output-of: titan-rocm fake | from "b" | lines 2 -->\n```\n'
                   'stale\n```\nafter\n- item:\n  <!-- output-of: titan-rocm fake | stderr -->'
                   '\n  ```\n  stale\n  ```\n')
    done = type("Done", (), {"stdout": "a\nb\nc\nd\n", "stderr": "e\n\nf\n", "returncode": 0})
    monkeypatch.setitem(_OUTPUTS, "titan-rocm fake", done)
    assert update([doc]) == [f"{doc}:10", f"{doc}:4"]
    assert doc.read_text() == ('intro\n<!-- output-of: titan-rocm fake | from "b" | lines 2 -->'
                               '\n```\nb\nc\n```\nafter\n- item:\n  <!-- output-of: titan-rocm '
                               'fake | stderr -->\n  ```\n  e\n\n  f\n  ```\n')
    assert update([doc]) == []  # now current


def test_a_figure_marker_takes_the_number_before_it(tmp_path, monkeypatch):
    doc = tmp_path / "page.md"
    doc.write_text("costs **6.85 %**<!-- figure: f/x a/0/b 1-x% --> and | 0.93<!-- figure: "
                   "f/x a/0/b --> |\n")
    monkeypatch.setattr(docs_quotes, "reanalysed", lambda folder: {"a": [{"b": 0.9315}]})
    cost, ratio = find_figures([doc])
    assert (cost.number, cost.path, cost.op, ratio.number) == ("6.85", ("a", "0", "b"),
                                                               "1-x%", "0.93")
    value = value_at(docs_quotes.reanalysed("f/x"), cost.path)
    assert cost.expected(value) == "6.85" and ratio.expected(value) == "0.93"
    assert ratio.expected(0.9356) != "0.93"  # a figure that moved is caught


# --- files the pages name ----------------------------------------------------------------

PATH = re.compile(r"(?<![\w/.-])((?:titan_rocm|tests|benchmarks|configs|scripts|docs)/"
                  r"[\w./-]*[\w/])")
UPSTREAM = {
    "scripts/download_hf_assets.py",  # TorchTitan's
    "tests/unit_tests/backends/torchtitan/test_aiter_mla_capability_patch.py",  # Primus's
    "tests/unit_tests/core/patches/test_triton_bufops_war.py",  # Primus's
}
"""Paths the pages cite in other repositories (each beside its repository's name)."""


def named_paths() -> list[tuple[str, str]]:
    """``(page:line, path)`` for every path of this repository the pages name in backticks,
    links or prose (wildcards and placeholders left out)."""
    found = []
    for page in docs_quotes.doc_paths():
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for m in PATH.finditer(line):
                path = m.group(1).rstrip(".")
                token = re.match(r"[^\s`)\]]*", line[m.end():]).group()
                if not any(c in token for c in "<*{") and path not in UPSTREAM:
                    found.append((f"{page.relative_to(REPO)}:{number}", path))
    return found


def test_every_file_a_page_names_exists():
    missing = [f"{where}: {path}" for where, path in named_paths() if not (REPO / path).exists()]
    assert not missing, "\n".join(missing)


GUARD_MESSAGE = re.compile(r"<!-- guard-message: step (\d+), rank (\d+) of (\d+), loss (\S+), "
                           r"grad_norm (\S+), found at (.+?) -->\n```\n(.*?)```", re.S)


def test_the_guard_message_the_page_quotes_is_the_guards():
    from titan_rocm.guard_message import Divergence, message

    text = (REPO / "docs" / "divergence-detection.md").read_text()
    (step, rank, world, loss, grad_norm, where, body), = GUARD_MESSAGE.findall(text)
    d = Divergence(int(step), int(rank), float(loss), float(grad_norm), where, int(world),
                   (int(rank),))
    assert body == message(d) + "\n"


SETS_ONE_RANK = {
    "titan_rocm.adapters.tt022.train": ("`titan-rocm-train`",),
    # audit_job and one_process (tune collect), both generations'
    "titan_rocm.adapters.common": ("`titan-rocm audit`", "`titan-rocm tune collect`"),
    # the shipped CPU trainer, also when a test or script builds it without the command
    "titan_rocm.adapters.tt022.cpu_trainer": ("`titan-rocm audit --trainer cpu`",),
}
"""Each module that gives a process started without torchrun the one-rank environment, and
the commands docs/environment-variables.md names for it."""


def test_the_environment_page_names_every_command_that_sets_the_one_rank_environment():
    package = REPO / "titan_rocm"
    callers = {".".join(p.relative_to(REPO).with_suffix("").parts)
               for p in package.rglob("*.py")
               if "single_process_environment()" in p.read_text()}
    assert callers == set(SETS_ONE_RANK)
    page = (REPO / "docs" / "environment-variables.md").read_text().splitlines()
    for first in ("| `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`",  # read
                  "| `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`"):  # set
        row = next(line for line in page if line.startswith(first))
        assert all(command in row for commands in SETS_ONE_RANK.values()
                   for command in commands), row


def test_converters_table_lists_every_workaround_in_apply_order():
    from titan_rocm.workarounds.registry import WORKAROUNDS

    text = (REPO / "docs" / "converters.md").read_text()
    listed = re.findall(r"^\| `rocm\.(\w+)` \|", text, re.M)
    assert listed == list(WORKAROUNDS), "docs/converters.md's table: every name, in apply order"


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        print("usage: python tests/unit/test_docs_quotes.py --update", file=sys.stderr)
        sys.exit(2)
    from titan_rocm import torchtitan_version

    for name in update(series=torchtitan_version.series()):
        print(f"updated {name}")
