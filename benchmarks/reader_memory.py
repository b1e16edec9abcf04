"""Peak memory of titan-rocm's readers against the size of their input (CPU only).

    python -m benchmarks.reader_memory [--scale 1.0] [--json]

Each reader runs in a fresh process on a generated input (in a temporary directory) of a
small and a large size; the table prints both peak RSS figures side by side and their ratio
(large / small). A reader whose memory does not grow with its input shows a ratio near 1; one
that refuses an input too large to read bounded says so (``refused``) and stays small.

- ``check-log``: a TorchTitan log of metric lines (every line a distinct step: the worst case;
  memory grows with the distinct steps logged, about 70 bytes each, not with the lines);
- ``check-log`` on a log whose metric lines repeat 1,000 steps (several ranks, restarts);
- ``compare`` of two such logs (a baseline and a run), both kinds: it reads each log lean,
  keeping per rank one entry per distinct step in arrays (8 to 25 bytes a step) and counts of
  the distinct throughput values, so memory does not grow with the metric lines; with every
  line a distinct step it grows with the steps (its text report prints the same figures);
- ``scan``: an AMDGCN file (the committed corpus kernel repeated: memory is about 3 times the
  file, read whole and parsed), and one past the 64 MiB the scanner reads (refused, named as
  not scanned, never read);
- ``plan``'s TOML reader (``job_args.load_toml``): a TOML of comments, and one past 16 MiB
  (refused before it is read).

``--scale`` multiplies the large sizes (1.0: 80 MB logs, 60 MB AMDGCN, 12 MB TOML).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import harness

CORPUS = harness.REPO / "tests" / "corpus" / "amdgcn" / "matmul-gfx942-nobuf.amdgcn"

# Runs one reader and prints its peak RSS (KiB on Linux) as the last line of stderr.
_CHILD = """
import resource, sys
kind, path = sys.argv[1], sys.argv[2]
more = sys.argv[3:]  # compare: the run's log beside the baseline's
if kind == "toml":
    from titan_rocm.adapters.tt022.job_args import JobArgsError, load_toml
    try:
        load_toml(["--job.config_file", path])
        code = 0
    except JobArgsError:
        code = 2
else:
    from titan_rocm.cli import main
    import io, contextlib
    with contextlib.redirect_stdout(io.StringIO()):
        code = main([kind, path, *more])
print(code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def _metric_line(step: int) -> bytes:
    return (f"[rank0]:[titan] 2026-12-01 10:00:00,000 - root - INFO - step: {step:6d}  loss: "
            f" 7.1234  grad_norm:  1.2345  memory: 12.34GiB(8.80%)  tps: 1,234  tflops: 56.78 "
            " mfu: 5.74%\n").encode()


def _write_repeated(path: Path, size: int, chunk: Callable[[int], bytes]) -> None:
    with path.open("wb") as f:
        i = 0
        while f.tell() < size:
            f.write(b"".join(chunk(i + k) for k in range(1000)))
            i += 1000


def make_input(kind: str, path: Path, size: int) -> None:
    """Write the input of ``kind`` at about ``size`` bytes to ``path``."""
    if kind.endswith("distinct steps"):
        _write_repeated(path, size, lambda i: _metric_line(i + 1))
    elif kind.endswith("1,000 steps"):
        _write_repeated(path, size, lambda i: _metric_line(i % 1000 + 1))
    elif kind.startswith("scan"):
        text = CORPUS.read_bytes()
        with path.open("wb") as f:
            while f.tell() < size:
                f.write(text)
    elif kind.startswith("plan TOML"):
        _write_repeated(path, size, lambda i: b"# a comment line of a job file\n")
    else:
        raise ValueError(kind)


@dataclass
class Row:
    """One reader: input sizes, peak RSS (MiB) and exit codes at both sizes."""

    reader: str
    small_mb: float
    large_mb: float
    small_rss_mib: float
    large_rss_mib: float
    small_exit: int
    large_exit: int

    @property
    def ratio(self) -> float:
        """Peak RSS at the large input over the small one."""
        return self.large_rss_mib / self.small_rss_mib

    def to_dict(self) -> dict:
        """The row with its ratio, for ``--json``."""
        return {**asdict(self), "ratio": round(self.ratio, 3)}


def peak(kind: str, path: Path) -> tuple[int, float]:
    """(exit code, peak RSS in MiB) of one reader on ``path`` (compare: on ``path`` and its
    copy, a second run), in a fresh process."""
    cli = {"plan TOML": "toml"}.get(kind.split(" (")[0], kind.split()[0])
    more = []
    if cli == "compare":
        run = path.with_name(path.name + "-run")
        shutil.copyfile(path, run)
        more = [str(run)]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, cli, str(path), *more], env=harness.child_env(),
            capture_output=True, text=True, check=False)
    finally:
        for extra in more:
            Path(extra).unlink()
    code, rss_kib = done.stderr.strip().splitlines()[-1].split()
    return int(code), int(rss_kib) / 1024


CASES: tuple[tuple[str, int, int], ...] = (
    ("check-log distinct steps", 2 << 20, 80 << 20),
    ("check-log 1,000 steps", 2 << 20, 80 << 20),
    ("compare 1,000 steps", 2 << 20, 80 << 20),
    ("compare distinct steps", 2 << 20, 80 << 20),
    ("scan", 2 << 20, 60 << 20),
    ("scan (past 64 MiB: refused)", 2 << 20, 1 << 30),
    ("plan TOML", 1 << 20, 12 << 20),
    ("plan TOML (past 16 MiB: refused)", 1 << 20, 200 << 20),
)


def measure(scale: float, directory: Path) -> list[Row]:
    """Every case of :data:`CASES`, its large size times ``scale`` (refusal sizes kept)."""
    rows = []
    for kind, small, large in CASES:
        if "refused" not in kind:
            large = max(small, int(large * scale))
        figures = []
        for size in (small, large):
            path = directory / f"input-{len(rows)}-{size}"
            make_input(kind, path, size)
            figures.append((path.stat().st_size / 1e6, *peak(kind, path)))
            path.unlink()
        (s_mb, s_code, s_rss), (l_mb, l_code, l_rss) = figures
        rows.append(Row(kind, round(s_mb, 1), round(l_mb, 1), round(s_rss, 1), round(l_rss, 1),
                        s_code, l_code))
    return rows


def table(rows: list[Row]) -> str:
    """The figures side by side."""
    from tabulate import tabulate

    return tabulate(
        [(r.reader, r.small_mb, r.small_rss_mib, r.large_mb, r.large_rss_mib,
          f"{r.ratio:.2f}", f"{r.small_exit}/{r.large_exit}") for r in rows],
        headers=("reader", "small MB", "peak MiB", "large MB", "peak MiB", "ratio", "exit"),
        tablefmt="github", disable_numparse=True)


def main(argv: list[str] | None = None) -> int:
    """Measure and print; 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the large sizes (default 1.0)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 10:
        parser.error(f"--scale {args.scale}: accepted: a number > 0 and <= 10")
    with tempfile.TemporaryDirectory(prefix="titan-rocm-memory-") as tmp:
        rows = measure(args.scale, Path(tmp))
    print(json.dumps([r.to_dict() for r in rows], indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
