"""What the docs quote, found and regenerated: command output, and figures of stored results.

**Command output.** Marker: an HTML comment on the line right before a fenced block, in any
``docs/*.md`` or ``README.md``::

    <!-- output-of: titan-rocm plan --arch gfx942 | from "  rocm.grouped_mm " | lines 8 -->
    ```
    ...the quoted lines...
    ```

- ``output-of:`` a ``titan-rocm`` (or ``titan-rocm-train``) command line (run from the
  repository root in its own process, split like a shell would; its stdout is quoted);
- ``from "TEXT"`` (optional): the quote starts at the first output line that starts with TEXT
  (default: the first line);
- ``lines N`` (optional): the quote is N lines long (default: to the end of the output);
- ``stderr`` (optional): quote what the command writes to stderr instead (a refusal);
- ``exit N`` (optional): the command must exit with N;
- ``torchtitan 0.3`` (optional): the command needs TorchTitan 0.3.0 installed (its suite
  regenerates the block); without it, the 0.2.2 suite does;
- ``without a GPU`` (optional): the block is what a machine without a GPU prints (skipped on
  one that has a GPU).

The parts are separated by `` | ``. After a change to a command's output, regenerate every
quoted block of the installed TorchTitan with one command (in each venv) and review the diff:

    python tests/unit/test_docs_quotes.py --update

**Figures of stored results.** Marker: an HTML comment right after a number in the text or a
table cell (invisible when rendered)::

    0.9315<!-- figure: 2026-11-30-h200-d/tp-moe-scope figures/throughput/deepseek_v3_4b/...
    ...tps_ratio_rocm_on_over_stock/pooled -->   (one line in the page)

- the folder under ``benchmarks/results/``, re-analysed from its logs by the benchmark its
  ``summary.json`` names (``environment.command``; ``benchmarks/gpu_validation.py`` for the
  first batch, which names none); a CPU result without logs (no ``environment``) is read as
  stored;
- the path of keys (and list indices), joined by ``/``, to the value in that re-analysis;
- optionally ``1-x%``: the number quoted is ``(1 - value) x 100``, a ratio's cost in percent;
  or ``x%``: ``value x 100``, a fraction in percent.

The value must round to the number quoted, at the number of decimals quoted.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
MARKER = re.compile(
    r"^(?P<indent>[ \t]*)<!-- output-of: (?P<spec>.+?) -->\n(?P=indent)(?P<fence>```[^\n]*)\n"
    r"(?P<body>.*?)^(?P=indent)```$",
    re.M | re.S,
)
FROM = re.compile(r'^from "(?P<text>.*)"$')
LINES = re.compile(r"^lines (?P<n>\d+)$")
EXIT = re.compile(r"^exit (?P<code>\d+)$")
SERIES = re.compile(r"^torchtitan (?P<series>0\.[23])$")
FIGURE = re.compile(
    r"(?P<number>\d+(?:\.\d+)?)[^\d<\n]{0,8}<!-- figure: (?P<folder>\S+) (?P<path>\S+)"
    r"(?: (?P<op>1-x%|x%))? -->"
)


def doc_paths() -> list[Path]:
    """README.md and every page under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _where(path: Path, text: str, offset: int) -> str:
    line = text[:offset].count("\n") + 1
    return f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}"


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
    indent: str = ""
    """The block's indentation (a block inside a list item), taken off each quoted line."""
    stream: str = "stdout"
    exit_code: int | None = None
    series: str = "0.2"
    """The TorchTitan release line the command needs."""
    without_gpu: bool = False

    @property
    def name(self) -> str:
        return _where(self.path, self.path.read_text(), self.start)


@dataclass(frozen=True)
class Spec:
    """A marker's parts."""

    command: str
    start_text: str | None = None
    lines: int | None = None
    stream: str = "stdout"
    exit_code: int | None = None
    series: str = "0.2"
    without_gpu: bool = False


def parse_spec(spec: str) -> Spec:
    """The parts of a marker's text.

    Raises:
        ValueError: naming the part that is none of the accepted ones.
    """
    command, *parts = [p.strip() for p in spec.split(" | ")]
    if not command.startswith(("titan-rocm ", "titan-rocm-train ")):
        raise ValueError(f"output-of: {command!r} is not a titan-rocm or titan-rocm-train "
                         "command")
    found: dict[str, Any] = {}
    for part in parts:
        if m := FROM.match(part):
            found["start_text"] = m.group("text")
        elif m := LINES.match(part):
            found["lines"] = int(m.group("n"))
        elif m := EXIT.match(part):
            found["exit_code"] = int(m.group("code"))
        elif m := SERIES.match(part):
            found["series"] = m.group("series")
        elif part == "stderr":
            found["stream"] = "stderr"
        elif part == "without a GPU":
            found["without_gpu"] = True
        else:
            raise ValueError(f"output-of part {part!r} is not valid; accepted: from \"TEXT\", "
                             "lines N, stderr, exit N, torchtitan 0.2|0.3, without a GPU")
    return Spec(command, **found)


def find_quotes(paths: list[Path] | None = None) -> list[Quote]:
    """Every marked block in the docs."""
    quotes = []
    for path in paths or doc_paths():
        text = path.read_text()
        for m in MARKER.finditer(text):
            spec = parse_spec(m.group("spec"))
            indent = m.group("indent")
            body = "".join(line[len(indent):] + "\n"
                           for line in m.group("body").splitlines())
            quotes.append(Quote(path, m.start("body"), m.end("body"), spec.command,
                                spec.start_text, spec.lines, body, indent, spec.stream,
                                spec.exit_code, spec.series, spec.without_gpu))
    return quotes


def has_gpu() -> bool:
    """Whether torch sees an accelerator here."""
    import torch

    return torch.accelerator.is_available()


_OUTPUTS: dict[str, subprocess.CompletedProcess] = {}


def command_run(command: str) -> subprocess.CompletedProcess:
    """``command`` (a ``titan-rocm`` or ``titan-rocm-train`` command line), run once, in its
    own process (a plan in this one would leave TorchTitan patched for the tests after it)."""
    if command not in _OUTPUTS:
        words = shlex.split(command)
        run = ("from titan_rocm.train import main; main()" if words[0] == "titan-rocm-train"
               else "from titan_rocm.cli import main; sys.exit(main(sys.argv[1:]))")
        args = [sys.executable, "-c", f"import sys; {run}", *words[1:]]
        _OUTPUTS[command] = subprocess.run(args, cwd=REPO, capture_output=True, text=True,
                                           timeout=600)
    return _OUTPUTS[command]


def expected_body(quote: Quote) -> str:
    """What the block must hold: the picked lines of the command's output.

    Raises:
        AssertionError: the command exited with another code than the marker's, or no line
            starts with the marker's ``from`` text.
    """
    done = command_run(quote.command)
    if quote.exit_code is not None and done.returncode != quote.exit_code:
        raise AssertionError(f"{quote.name}: `{quote.command}` exited {done.returncode}, the "
                             f"marker says {quote.exit_code}; stderr: {done.stderr[-2000:]}")
    lines = (done.stderr if quote.stream == "stderr" else done.stdout).splitlines()
    first = 0
    if quote.start_text is not None:
        found = [i for i, line in enumerate(lines) if line.startswith(quote.start_text)]
        if not found:
            raise AssertionError(f"{quote.name}: no line of `{quote.command}` starts with "
                                 f"{quote.start_text!r}")
        first = found[0]
    picked = lines[first:] if quote.lines is None else lines[first:first + quote.lines]
    return "".join(line + "\n" for line in picked)


def update(paths: list[Path] | None = None, series: str | None = None) -> list[str]:
    """Rewrite every quoted block (of TorchTitan ``series``, or all) from its command; return
    the names of those changed."""
    changed = []
    by_path: dict[Path, list[Quote]] = {}
    for quote in find_quotes(paths):
        if (series is None or quote.series == series) and not (quote.without_gpu
                                                                and has_gpu()):
            by_path.setdefault(quote.path, []).append(quote)
    for path, quotes in by_path.items():
        text = path.read_text()
        for quote in reversed(quotes):  # offsets stay valid from the end
            body = expected_body(quote)
            if body != quote.body:
                changed.append(quote.name)
                indented = "".join(quote.indent + line if line.strip() else line
                                   for line in body.splitlines(keepends=True))
                text = text[: quote.start] + indented + text[quote.end:]
        path.write_text(text)
    return changed


# --- figures of stored results -------------------------------------------------------------

@dataclass(frozen=True)
class Figure:
    """One number the docs quote from a stored result, and where its value is."""

    where: str
    number: str
    folder: str
    path: tuple[str, ...]
    op: str | None = None

    def expected(self, value: float) -> str:
        """``value`` as the docs would quote it: the op applied, rounded as the number is."""
        if self.op == "1-x%":
            value = (1 - value) * 100
        elif self.op == "x%":
            value *= 100
        decimals = len(self.number.partition(".")[2])
        return f"{value:.{decimals}f}"


def find_figures(paths: list[Path] | None = None) -> list[Figure]:
    """Every number with a figure marker in the docs."""
    figures = []
    for path in paths or doc_paths():
        text = path.read_text()
        for m in FIGURE.finditer(text):
            figures.append(Figure(_where(path, text, m.start()), m.group("number"),
                                  m.group("folder"), tuple(m.group("path").split("/")),
                                  m.group("op")))
    return figures


def benchmark_of(folder: Path) -> str:
    """The benchmark script that made ``folder`` (its ``summary.json``'s command)."""
    command = json.loads((folder / "summary.json").read_text()).get("environment", {}).get(
        "command") or "benchmarks/gpu_validation.py"
    return Path(command.split()[0]).stem


@functools.cache
def reanalysed(folder: str) -> dict[str, Any]:
    """``benchmarks/results/<folder>`` re-analysed from its logs by its own benchmark; a CPU
    result that stores no logs (no ``environment`` in its ``summary.json``: the measurement
    is the summary itself) as stored."""
    directory = RESULTS / folder
    summary = json.loads((directory / "summary.json").read_text())
    if "environment" not in summary:
        return summary
    return importlib.import_module(f"benchmarks.{benchmark_of(directory)}").reanalyse(directory)


def value_at(tree: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` (dict keys; list indices as numbers)."""
    for key in path:
        tree = tree[int(key)] if isinstance(tree, (list, tuple)) else tree[key]
    return tree


# --- links between pages ------------------------------------------------------------------

LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<title>.+?)[ \t]*#*[ \t]*$", re.M)
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", re.M | re.S)


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped (``-``
    and ``_`` kept), each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of ``path`` (a repeated title's ``-1``, ``-2`` too)."""
    seen: dict[str, int] = {}
    for m in HEADING.finditer(FENCE.sub("", path.read_text())):
        slug = anchor(m.group("title"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        if n:
            seen[f"{slug}-{n}"] = 1
    return set(seen)


def broken_links(paths: list[Path] | None = None) -> list[str]:
    """``page:line: target (why)`` for each relative markdown link whose file or heading does
    not exist."""
    broken = []
    for path in paths or doc_paths():
        text = path.read_text()
        for m in LINK.finditer(FENCE.sub(lambda f: re.sub(r"[^\n]", " ", f.group()), text)):
            target = m.group("target")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, fragment = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            where = _where(path, text, m.start())
            if not linked.exists():
                broken.append(f"{where}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"{where}: {target} (no heading with that anchor)")
    return broken
