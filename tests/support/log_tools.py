"""The three log tools on one training log, in process, as a user runs them (tests only):
``check-log --json``, ``bench-summary --json`` and ``compare --json`` against a baseline."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan_rocm.cli import main

TORCHTITAN_FORMAT = "[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"
"""The root handler's format TorchTitan's ``init_logger`` installs (0.2.2 and 0.3.0,
``torchtitan/tools/logging.py``), which ``torchtitan.train`` calls and an in-process
trainer does not."""


@dataclass
class Tools:
    """Each tool's exit code and JSON on one log."""

    check_code: int
    check: dict[str, Any]
    """check-log's entry for the file."""
    bench_code: int
    bench: dict[str, Any]
    compare_code: int
    compare: dict[str, Any]
    """compare's run entry (the log against the baseline)."""


def _json(args: list[str]) -> tuple[int, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    return code, json.loads(out.getvalue())


def run_tools(log: Path, baseline: Path, warmup: int = 0) -> Tools:
    """check-log, bench-summary (``--warmup``) and compare (``log`` against ``baseline``)."""
    check_code, check = _json(["check-log", "--json", str(log)])
    bench_code, bench = _json(["bench-summary", "--json", "--warmup", str(warmup), str(log)])
    compare_code, compared = _json(["compare", "--json", "--warmup", str(warmup),
                                    "--label", "baseline", "--label", "run",
                                    str(baseline), str(log)])
    return Tools(check_code, check["files"][0], bench_code, bench, compare_code,
                 compared["runs"][0])


@contextlib.contextmanager
def torchtitan_log(path: Path) -> Iterator[None]:
    """Write every log record at INFO and above to ``path`` in TorchTitan's format while the
    block runs (an in-process trainer's log, as ``torchtitan.train`` would print it)."""
    root = logging.getLogger()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(TORCHTITAN_FORMAT))
    handler.setLevel(logging.INFO)
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()
