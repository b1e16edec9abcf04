"""What the compile wrapper did, in this process and in every compile worker (one JSON line per
compile under ``TITAN_ROCM_TRITON_WAR_STATS_DIR``, merged by :func:`collect`)."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_rocm.log import log_once
from titan_rocm.scanner.names import ENV_STATS_DIR
from titan_rocm.serial import json_form

__all__ = ["Stats", "collect", "local", "record"]

# Outcomes of one compile, each counted once.
CLEAN = "clean"
"""Scanned, no hazard: the kernel is returned untouched."""
PATCHED = "patched"
"""Hazardous; recompiled with buffer ops off and rescanned clean."""
RESIDUAL = "residual"
"""Hazardous and not fixed (recompile failed or still hazardous): the original is kept."""
SKIPPED_NON_HIP = "skipped_non_hip"
"""Not a HIP target (CUDA...): not scanned."""
UNSCANNED = "unscanned"
"""HIP kernel without AMDGCN text (``TRITON_STORE_BINARY_ONLY``) or the scan failed."""

OUTCOMES: tuple[str, ...] = (CLEAN, PATCHED, RESIDUAL, SKIPPED_NON_HIP, UNSCANNED)
# Outcomes whose kernel names are kept (the rare, interesting ones).
_NAMED: tuple[str, ...] = (PATCHED, RESIDUAL, UNSCANNED)


@dataclass
class Stats:
    """Counts of one or more processes' compiles through the wrapper."""

    scanned: int = 0
    skipped_non_hip: int = 0
    unscanned: int = 0
    hazardous: int = 0
    patched: int = 0
    residual: int = 0
    names: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in _NAMED})
    """For patched, residual and unscanned kernels."""
    processes: int = 1
    bad_lines: int = 0
    """Stats-file lines that could not be read (truncated writes), when merged."""

    @property
    def compiled(self) -> int:
        """Compiles seen by the wrapper (every outcome)."""
        return self.scanned + self.skipped_non_hip + self.unscanned

    def add(self, outcome: str, kernel: str) -> None:
        """Count one compile with ``outcome`` (one of :data:`OUTCOMES`)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; accepted: {', '.join(OUTCOMES)}")
        if outcome in (CLEAN, PATCHED, RESIDUAL):
            self.scanned += 1
        if outcome in (PATCHED, RESIDUAL):
            self.hazardous += 1
        if outcome == PATCHED:
            self.patched += 1
        elif outcome == RESIDUAL:
            self.residual += 1
        elif outcome == SKIPPED_NON_HIP:
            self.skipped_non_hip += 1
        elif outcome == UNSCANNED:
            self.unscanned += 1
        if outcome in _NAMED and kernel not in self.names[outcome]:
            self.names[outcome].append(kernel)

    def merge(self, other: Stats) -> None:
        """Add ``other``'s counts to these."""
        for name in ("scanned", "skipped_non_hip", "unscanned", "hazardous", "patched",
                     "residual", "processes", "bad_lines"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for outcome, kernels in other.names.items():
            mine = self.names.setdefault(outcome, [])
            mine.extend(k for k in kernels if k not in mine)

    def to_dict(self) -> dict[str, Any]:
        return json_form(
            self, "compiled scanned skipped_non_hip unscanned hazardous patched residual names "
            "processes bad_lines", names={k: list(v) for k, v in self.names.items()})


_lock = threading.Lock()
_local = Stats()


def local() -> Stats:
    """This process's counts (a copy)."""
    with _lock:
        copy = Stats(processes=1)
        copy.merge(_local)
        copy.processes = 1
        return copy


def reset_local() -> None:
    """Forget this process's counts (tests)."""
    global _local
    with _lock:
        _local = Stats()


def stats_file(directory: str | os.PathLike[str]) -> Path:
    """This process's stats file in ``directory``."""
    return Path(directory) / f"{socket.gethostname()}-{os.getpid()}.jsonl"


def record(outcome: str, kernel: str, **details: Any) -> None:
    """Count one compile here and, with a stats directory, append it to this process's file."""
    with _lock:
        _local.add(outcome, kernel)
        directory = os.environ.get(ENV_STATS_DIR)
        if not directory:
            return
        line = json.dumps({"pid": os.getpid(), "outcome": outcome, "kernel": kernel, **details})
        try:
            # One small write per line in append mode: lines from one process never interleave.
            with open(stats_file(directory), "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:
            # Stats must never break a compile; say once per process that they are incomplete.
            log_once(f"triton_war-stats:{directory}", logging.WARNING,
                     "titan-rocm: cannot write triton_war stats to %r: %s", directory, e)


def read_file(path: str | os.PathLike[str]) -> Stats:
    """The counts recorded in one stats file."""
    stats = Stats()
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            try:
                entry = json.loads(raw)
                stats.add(entry["outcome"], str(entry["kernel"]))
            except (ValueError, KeyError, TypeError):
                stats.bad_lines += 1
    return stats


def collect(directory: str | os.PathLike[str] | None = None) -> Stats:
    """Merged counts of every process that wrote to ``directory`` (default: the environment's;
    without one, this process alone). Raises FileNotFoundError for a missing directory."""
    directory = directory or os.environ.get(ENV_STATS_DIR)
    if not directory:
        return local()
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"triton_war stats directory {str(root)!r} does not exist")
    total = Stats(processes=0)
    for path in sorted(root.glob("*.jsonl")):
        total.merge(read_file(path))
    return total


def main(argv: list[str] | None = None) -> int:
    """``python -m titan_rocm.workarounds.triton_war.stats [DIR]``: print merged stats as JSON."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        print("usage: python -m titan_rocm.workarounds.triton_war.stats [DIR]", file=sys.stderr)
        return 2
    try:
        merged = collect(args[0] if args else None)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(merged.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
