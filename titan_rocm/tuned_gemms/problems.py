"""GEMM problems: what ``tune collect`` records and ``tune run`` tunes (docs/validated-tuning.md).
Torch-free; a problem keeps each choices call of its lowering, as each has its own key."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_rocm.files import read_regular

FORMAT = 1

GEMM_OPS: tuple[str, ...] = (
    "mm", "addmm", "bmm", "baddbmm", "mm_plus_mm", "int_mm", "scaled_mm",
)
"""Inductor lowerings whose candidates go through the choices handler."""

TUNABLE_OPS: tuple[str, ...] = ("mm", "addmm", "bmm", "baddbmm", "mm_plus_mm", "int_mm")
"""Ops ``tune run`` can check against a reference (scaled_mm needs its scales: not yet)."""


class ProblemsError(ValueError):
    """A problems file cannot be used; the message says why and what is accepted."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor's dtype (as ``str(torch.dtype)``), shape, strides and storage offset."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "stride": list(self.stride),
                "offset": self.offset}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(str(d["dtype"]), tuple(int(x) for x in d["shape"]),
                   tuple(int(x) for x in d["stride"]), int(d.get("offset", 0)))


@dataclass(frozen=True)
class Template:
    """A template a call offered: Inductor's ``uid`` (``triton::mm``) and its source hash."""

    uid: str
    src_hash: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "src_hash": self.src_hash}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Template:
        return cls(str(d["uid"]), d.get("src_hash"))


@dataclass(frozen=True)
class Call:
    """One ``get_template_configs`` call within a lowering."""

    key: str
    """Device-agnostic lookup key: ``<inputs key>+<op>``."""
    inputs: tuple[TensorSpec, ...]
    templates: tuple[Template, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "inputs": [t.to_dict() for t in self.inputs],
                "templates": [t.to_dict() for t in self.templates]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Call:
        return cls(str(d["key"]), tuple(TensorSpec.from_dict(x) for x in d["inputs"]),
                   tuple(Template.from_dict(x) for x in d["templates"]))


@dataclass(frozen=True)
class Problem:
    """One GEMM lowering of the job (see the module docstring)."""

    op: str
    calls: tuple[Call, ...]
    output: TensorSpec
    scalars: dict[str, Any] = field(default_factory=dict)
    count: int = 1
    """Not part of its identity."""

    @property
    def key(self) -> str:
        """The first call's key (ATen's, whose inputs are the op's)."""
        return self.calls[0].key

    @property
    def keys(self) -> tuple[str, ...]:
        """Every distinct lookup key the lowering asks for, in order."""
        return tuple(dict.fromkeys(c.key for c in self.calls))

    @property
    def args(self) -> tuple[TensorSpec, ...]:
        """The op's own arguments (the first call's inputs)."""
        return self.calls[0].inputs

    @property
    def tunable(self) -> bool:
        """Whether ``tune run`` can check this op's candidates against a reference."""
        return self.op in TUNABLE_OPS

    def to_dict(self) -> dict[str, Any]:
        """A ``problem`` record without its ``type``."""
        return {"key": self.key, "op": self.op, "calls": [c.to_dict() for c in self.calls],
                "output": self.output.to_dict(), "scalars": dict(self.scalars),
                "count": self.count}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Problem:
        problem = cls(str(d["op"]), tuple(Call.from_dict(c) for c in d["calls"]),
                      TensorSpec.from_dict(d["output"]), dict(d.get("scalars") or {}),
                      int(d.get("count", 1)))
        if not problem.calls:
            raise ValueError("a problem needs at least one call")
        if "key" in d and d["key"] != problem.key:
            raise ValueError(f"key {d['key']!r} is not its first call's key {problem.key!r}")
        return problem


def merge(problems: Iterable[Problem]) -> list[Problem]:
    """One problem per key, in first-seen order, with the counts added up."""
    merged: dict[str, Problem] = {}
    for p in problems:
        seen = merged.get(p.key)
        merged[p.key] = p if seen is None else Problem(
            seen.op, seen.calls, seen.output, seen.scalars, seen.count + p.count)
    return list(merged.values())


def job_id(job: dict[str, Any]) -> str:
    """A short stable hash of a job description (``job`` header without ``id``)."""
    body = {k: v for k, v in job.items() if k != "id"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class ProblemsFile:
    """A problems file: the job header and the problems, plus the file's hash."""

    header: dict[str, Any]
    problems: list[Problem]
    sha256: str

    @property
    def job(self) -> dict[str, Any]:
        """Which job the problems come from."""
        return dict(self.header.get("job") or {})

    @property
    def env(self) -> dict[str, Any]:
        """The device and versions the job was collected on."""
        return dict(self.header.get("env") or {})

    @property
    def settings(self) -> dict[str, Any]:
        """The job's ``[rocm]`` settings."""
        return dict(self.header.get("settings") or {})


def header(job: dict[str, Any], env: dict[str, Any], settings: dict[str, Any],
           created: str) -> dict[str, Any]:
    """The ``job`` header record of a problems file."""
    job = {**job, "id": job_id(job)}
    return {"type": "job", "format": FORMAT, "job": job, "env": env, "settings": settings,
            "created": created}


def dumps(head: dict[str, Any], problems: Sequence[Problem]) -> bytes:
    """The bytes of a problems file."""
    lines = [json.dumps(head, sort_keys=True)]
    lines += [json.dumps({"type": "problem", **p.to_dict()}, sort_keys=True) for p in problems]
    return ("\n".join(lines) + "\n").encode()


def parse(data: bytes, path: str | Path) -> ProblemsFile:
    """Parse a problems file's bytes (``path`` is for messages); raises ProblemsError."""
    head: dict[str, Any] | None = None
    problems: list[Problem] = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProblemsError(f"{where}: not a JSON line ({exc.msg})") from None
        except RecursionError:
            raise ProblemsError(f"{where}: nested deeper than a JSON reader accepts: not a "
                                "line `tune collect` writes") from None
        kind = record.get("type") if isinstance(record, dict) else None
        if head is None:
            if kind != "job":
                raise ProblemsError(
                    f"{where}: expected the 'job' header of a problems file written by "
                    "`titan-rocm tune collect`")
            if record.get("format") != FORMAT:
                raise ProblemsError(f"{where}: problems format {record.get('format')!r}; this "
                                    f"titan-rocm reads format {FORMAT}")
            head = record
            continue
        if kind != "problem":
            raise ProblemsError(f"{where}: record type {kind!r}; accepted: problem")
        try:
            problems.append(Problem.from_dict(record))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProblemsError(f"{where}: not a valid problem record ({exc!r})") from None
    if head is None:
        raise ProblemsError(f"{path}: empty; expected a problems file from "
                            "`titan-rocm tune collect`")
    keys = [p.key for p in problems]
    if len(set(keys)) != len(keys):
        raise ProblemsError(f"{path}: a problem key appears twice; the file was edited or "
                            "concatenated from several jobs")
    return ProblemsFile(head, problems, hashlib.sha256(data).hexdigest())


def read(path: str | Path) -> ProblemsFile:
    """Read a problems file; raises ProblemsError when unreadable or not one."""
    try:
        data = read_regular(path)  # a FIFO is refused, never waited on
    except OSError as exc:
        raise ProblemsError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse(data, path)
