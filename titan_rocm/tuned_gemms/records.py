"""The results file of ``titan-rocm tune run``: JSON lines, append-only so a kill loses at most the
line being written (docs/validated-tuning.md). Torch-free."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_rocm.files import read_regular

STATUSES: tuple[str, ...] = (
    "pass", "mismatch", "nan", "cuda_error", "crash", "hang", "compile_error",
)
"""Terminal results of a task. Only ``pass`` ever enters a table."""

QUARANTINE_ERROR = "started twice without a result: not run a third time"

ENV_FIELDS: tuple[str, ...] = ("torch", "triton", "hip", "cuda")
"""Versions that are part of a task's identity (with the device key)."""


class ResultsError(ValueError):
    """A results file cannot be used; the message says why."""


def task_id(key: str, template_id: str, params: dict[str, Any], template_hash: str | None,
            env: dict[str, Any]) -> str:
    """Content hash of a task: the problem key, the candidate and the software it runs on."""
    body = [key, template_id, params, template_hash, env.get("device_key")]
    body += [env.get(name) for name in ENV_FIELDS]
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """Every record of a results file (none if missing) and how many garbled lines were skipped;
    ResultsError when it cannot be read."""
    path = Path(path)
    try:
        data = read_regular(path)  # a FIFO is refused, never waited on
    except FileNotFoundError:
        return [], 0
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read ({exc.strerror or exc})") from None
    records: list[dict[str, Any]] = []
    garbled = 0
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            garbled += 1  # RecursionError: nested deeper than json can read, not a record
            continue
        if isinstance(record, dict) and isinstance(record.get("type"), str):
            records.append(record)
        else:
            garbled += 1
    return records, garbled


@dataclass
class State:
    """What a results file says has happened."""

    run: dict[str, Any] | None = None
    envs: list[dict[str, Any]] = field(default_factory=list)
    problems: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Problem key -> its latest ``problem`` record."""
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Task id -> its first terminal record."""
    started: Counter[str] = field(default_factory=Counter)
    garbled: int = 0

    def add(self, record: dict[str, Any]) -> None:
        """Account for one record."""
        kind = record.get("type")
        if kind == "run" and self.run is None:
            self.run = record
        elif kind == "env" and record.get("env") not in self.envs:
            self.envs.append(record.get("env"))
        elif kind == "problem" and "key" in record:
            self.problems[record["key"]] = record
        elif kind == "started" and "task" in record:
            self.started[record["task"]] += 1
        elif kind == "result" and record.get("status") in STATUSES and "task" in record:
            self.results.setdefault(record["task"], record)
        elif kind == "retry" and record.get("task") in self.quarantined():
            del self.results[record["task"]]
            self.started[record["task"]] = 0

    def started_twice(self) -> list[str]:
        """Started at least twice without a result: never run a third time."""
        return [t for t, n in self.started.items() if n >= 2 and t not in self.results]

    def quarantined(self) -> list[str]:
        """Recorded ``crash`` after two starts without a result (``--retry-quarantined``)."""
        return [t for t, r in self.results.items() if r.get("status") == "crash" and (
            r.get("quarantined") or r.get("error") == QUARANTINE_ERROR)]

    def counts(self) -> Counter[str]:
        """Terminal results by status."""
        return Counter(r["status"] for r in self.results.values())


def load_state(path: str | Path) -> State:
    """The :class:`State` of a results file (empty when it does not exist)."""
    return load_many([path])


def load_many(paths: Iterable[str | Path]) -> State:
    """One :class:`State` over several results files (e.g. one per node)."""
    state = State()
    for path in paths:
        records, garbled = read_records(path)
        state.garbled += garbled
        for record in records:
            state.add(record)
    return state


class Appender:
    """Appends records, one whole fsync'ed line each; a failed write is cut back before the OSError,
    so the file stays resumable."""

    def __init__(self, path: str | Path, fail_after: int | None = None) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._fail_after = fail_after  # test-only: faults.ENV_DISK_FULL
        self._written = 0
        size = os.fstat(self._fd).st_size
        if size > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    self._append(b"\n")

    def _append(self, data: bytes) -> None:
        start = os.fstat(self._fd).st_size
        try:
            if self._fail_after is not None and self._written >= self._fail_after:
                os.write(self._fd, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, start)  # never leave a cut line behind
            except OSError:
                pass  # the partial line is then one garbled line, skipped on resume
            raise

    def write(self, record: dict[str, Any]) -> None:
        """Write one record durably; on OSError the file is as it was."""
        self._append(json.dumps(record, sort_keys=True, default=str).encode() + b"\n")
        self._written += 1

    def close(self) -> None:
        os.close(self._fd)
