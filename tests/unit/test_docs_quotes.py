"""Command output quoted in the docs is regenerated from the command and compared.

Marker: an HTML comment on the line right before a fenced block, in any ``docs/*.md`` or
``README.md``::

    <!-- output-of: titan-rocm plan --arch gfx942 | from "  rocm.grouped_mm " | lines 8 -->
    ```
    ...the quoted lines...
    ```

- ``output-of:`` a ``titan-rocm`` command line (run from the repository root in its own
  process, split like a shell would; its exit code is not checked, its stdout is quoted);
- ``from "TEXT"`` (optional): the quote starts at the first output line that starts with TEXT
  (default: the first line);
- ``lines N`` (optional): the quote is N lines long (default: to the end of the output).

The parts are separated by `` | ``. After a change to a command's output, regenerate every
quoted block with one command and review the diff:

    python tests/unit/test_docs_quotes.py --update
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(
    r"^<!-- output-of: (?P<spec>.+?) -->\n(?P<fence>```[^\n]*)\n(?P<body>.*?)^```$",
    re.M | re.S,
)
FROM = re.compile(r'^from "(?P<text>.*)"$')
LINES = re.compile(r"^lines (?P<n>\d+)$")


@dataclass(frozen=True)
class Quote:
    """One quoted block: where it is, the command, and how its lines are picked."""

    path: Path
    start: int
    """Offset of the block's body in the file."""
    end: int
    command: str
    start_text: str | None
    lines: int | None
    body: str

    @property
    def name(self) -> str:
        line = self.path.read_text()[: self.start].count("\n") + 1
        where = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{where}:{line}"


def parse_spec(spec: str) -> tuple[str, str | None, int | None]:
    """``(command, from-text, lines)`` of a marker's text.

    Raises:
        ValueError: naming the part that is not ``from "..."`` or ``lines N``.
    """
    command, *parts = [p.strip() for p in spec.split(" | ")]
    if not command.startswith("titan-rocm "):
        raise ValueError(f"output-of: {command!r} is not a titan-rocm command")
    start_text = lines = None
    for part in parts:
        if m := FROM.match(part):
            start_text = m.group("text")
        elif m := LINES.match(part):
            lines = int(m.group("n"))
        else:
            raise ValueError(f"output-of part {part!r} is not valid; accepted: from \"TEXT\", "
                             "lines N")
    return command, start_text, lines


def find_quotes(paths: list[Path] | None = None) -> list[Quote]:
    """Every marked block in the docs."""
    paths = paths or [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    quotes = []
    for path in paths:
        text = path.read_text()
        for m in MARKER.finditer(text):
            command, start_text, lines = parse_spec(m.group("spec"))
            quotes.append(Quote(path, m.start("body"), m.end("body"), command, start_text,
                                lines, m.group("body")))
    return quotes


_OUTPUTS: dict[str, str] = {}


def command_output(command: str) -> str:
    """The stdout of ``command`` (a ``titan-rocm`` command line), run once, in its own process
    (a plan in this one would leave TorchTitan patched for the tests after it)."""
    if command not in _OUTPUTS:
        args = [sys.executable, "-c", "import sys; from titan_rocm.cli import main; "
                "sys.exit(main(sys.argv[1:]))", *shlex.split(command)[1:]]
        done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
        _OUTPUTS[command] = done.stdout
    return _OUTPUTS[command]


def expected_body(quote: Quote) -> str:
    """What the block must hold: the picked lines of the command's output."""
    lines = command_output(quote.command).splitlines()
    first = 0
    if quote.start_text is not None:
        found = [i for i, line in enumerate(lines) if line.startswith(quote.start_text)]
        if not found:
            raise AssertionError(f"{quote.name}: no line of `{quote.command}` starts with "
                                 f"{quote.start_text!r}")
        first = found[0]
    picked = lines[first:] if quote.lines is None else lines[first:first + quote.lines]
    return "".join(line + "\n" for line in picked)


def update(paths: list[Path] | None = None) -> list[str]:
    """Rewrite every quoted block from its command; return the names of those changed."""
    changed = []
    by_path: dict[Path, list[Quote]] = {}
    for quote in find_quotes(paths):
        by_path.setdefault(quote.path, []).append(quote)
    for path, quotes in by_path.items():
        text = path.read_text()
        for quote in reversed(quotes):  # offsets stay valid from the end
            body = expected_body(quote)
            if body != quote.body:
                changed.append(quote.name)
                text = text[: quote.start] + body + text[quote.end:]
        path.write_text(text)
    return changed


QUOTES = find_quotes()


def test_the_docs_quote_some_output():
    assert len(QUOTES) >= 4  # a marker typo would silently drop a quote


@pytest.mark.parametrize("quote", QUOTES, ids=[q.name for q in QUOTES])
def test_quoted_output_is_what_the_command_prints(quote):
    pytest.importorskip("torchtitan")
    assert quote.body == expected_body(quote), (
        f"{quote.name} quotes `{quote.command}`, whose output changed: run "
        "`python tests/unit/test_docs_quotes.py --update` and review the diff")


def test_a_bad_marker_part_is_named():
    with pytest.raises(ValueError, match=r"part 'line 3' is not valid; accepted: from"):
        parse_spec('titan-rocm plan | line 3')
    with pytest.raises(ValueError, match="is not a titan-rocm command"):
        parse_spec("ls -l")


def test_update_rewrites_a_stale_block(tmp_path, monkeypatch):
    doc = tmp_path / "page.md"
    doc.write_text('intro\n<!-- output-of: titan-rocm fake | from "b" | lines 2 -->\n```\n'
                   'stale\n```\nafter\n')
    monkeypatch.setitem(_OUTPUTS, "titan-rocm fake", "a\nb\nc\nd\n")
    assert update([doc]) == [f"{doc}:4"]
    assert doc.read_text() == ('intro\n<!-- output-of: titan-rocm fake | from "b" | lines 2 -->'
                               '\n```\nb\nc\n```\nafter\n')
    assert update([doc]) == []  # now current


def test_converters_table_lists_every_workaround_in_apply_order():
    from titan_rocm.workarounds.registry import WORKAROUNDS

    text = (REPO / "docs" / "converters.md").read_text()
    listed = re.findall(r"^\| `rocm\.(\w+)` \|", text, re.M)
    assert listed == list(WORKAROUNDS), "docs/converters.md's table: every name, in apply order"


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        print("usage: python tests/unit/test_docs_quotes.py --update", file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, str(REPO))
    for name in update():
        print(f"updated {name}")
