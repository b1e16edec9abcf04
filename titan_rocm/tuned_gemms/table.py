"""Validated GEMM tables, in Inductor's ``lookup_table`` format so it reads them unchanged:
built from ``tune run``'s ``pass`` results, read by ``rocm.gemm_lookup``. Torch-free."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from titan_rocm.files import read_regular, write_atomic
from titan_rocm.tuned_gemms.problems import FORMAT
from titan_rocm.tuned_gemms.records import ENV_FIELDS, State

META_FIELDS: tuple[str, ...] = ("device_key", *ENV_FIELDS, "fp32_precision")
"""Meta fields a training run must match to use a table."""


class LookupTableError(ValueError):
    """A table (or the results it is built from) cannot be used; the message says why."""


def entry_of(result: dict[str, Any]) -> dict[str, Any]:
    """The lookup-table entry of a ``result`` record."""
    entry = {"template_id": result["template_id"], **result.get("params", {})}
    if result.get("template_hash") is not None:
        entry["template_hash"] = result["template_hash"]
    return entry


def full_key(device_key: str | None, key: str) -> str:
    """``<device key>+<key>``; the key alone when the device has none (CPU)."""
    return f"{device_key}+{key}" if device_key else key


@dataclass
class ProblemChoice:
    """What the table holds for one problem, and why."""

    key: str
    op: str
    winner: dict[str, Any] | None
    """None: no validated candidate."""
    reason: str
    tasks: int
    done: int
    statuses: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "op": self.op, "reason": self.reason,
            "winner": None if self.winner is None else {
                "template_id": self.winner["template_id"], "time_ms": self.winner.get("time_ms"),
                "params": self.winner.get("params", {})},
            "tasks": self.tasks, "done": self.done, "statuses": self.statuses,
        }


@dataclass
class Built:
    """A built table and the per-problem decisions behind it."""

    meta: dict[str, Any]
    table: dict[str, list[dict[str, Any]]]
    decisions: list[ProblemChoice]
    garbled: int

    @property
    def missing(self) -> list[ProblemChoice]:
        """Problems with no validated winner."""
        return [d for d in self.decisions if d.winner is None]

    def to_bytes(self) -> bytes:
        """The table file's bytes."""
        return (json.dumps({"meta": self.meta, "table": self.table}, indent=1, sort_keys=True)
                + "\n").encode()


def _decide(key: str, problem: dict[str, Any], results: list[dict[str, Any]],
            min_speedup: float) -> ProblemChoice:
    op = str(problem.get("op", "?"))
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    tasks = len(problem.get("tasks") or [])
    passed = [r for r in results if r["status"] == "pass" and r.get("time_ms") is not None]
    aten = [r for r in passed if r["template_id"].startswith("aten::")]
    others = [r for r in passed if not r["template_id"].startswith("aten::")
              and r.get("representable", True)]
    made = ProblemChoice(key, op, None, "", tasks, len(results), statuses)
    if not aten:
        made.reason = ("no ATen timing (not run yet, or ATen failed): the training run falls "
                       "back to ATen for it" if not passed else
                       "ATen has no pass to compare with: not tabled")
        return made
    best_aten = min(aten, key=lambda r: r["time_ms"])
    best = min(others, key=lambda r: r["time_ms"], default=None)
    if best is not None and best["time_ms"] > 0 and \
            best_aten["time_ms"] / best["time_ms"] > min_speedup:
        made.winner = best
        made.reason = (f"{best['template_id']} {best_aten['time_ms'] / best['time_ms']:.3f}x "
                       f"ATen's speed (> {min_speedup})")
    else:
        made.winner = best_aten
        made.reason = (f"no validated template beats ATen by more than {min_speedup}x"
                       if best is not None else "no template that a table can hold passed")
    return made


def build(state: State, min_speedup: float = 1.0, created: str | None = None) -> Built:
    """The table of a results :class:`State`; LookupTableError for results that are not ``tune
    run``'s or mix devices or software."""
    if state.run is None:
        raise LookupTableError(
            "no 'run' record: not a results file written by `titan-rocm tune run`"
        )
    if not state.envs:
        raise LookupTableError(
            "no 'env' record: the run never got a device ready, nothing was tuned"
        )
    distinct = {json.dumps({k: e.get(k) for k in META_FIELDS}, sort_keys=True)
                for e in state.envs}
    if len(distinct) > 1:
        raise LookupTableError("results from several devices or software versions: "
                         + "; ".join(sorted(distinct)) + ": tune each separately")
    env = state.envs[0]
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in state.results.values():
        by_key.setdefault(r.get("key", ""), []).append(r)
    decisions: list[ProblemChoice] = []
    table: dict[str, list[dict[str, Any]]] = {}
    for key in state.run.get("problems", []):
        problem = state.problems.get(key, {"op": key.rsplit("+", 1)[-1], "tasks": []})
        decision = _decide(key, problem, by_key.get(key, []), min_speedup)
        decisions.append(decision)
        if decision.winner is not None:
            for call_key in problem.get("keys") or [key]:
                table[full_key(env.get("device_key"), call_key)] = [entry_of(decision.winner)]
    meta = {name: env.get(name) for name in META_FIELDS}
    meta.update(device=env.get("device"), format=FORMAT, min_speedup=min_speedup,
                job=state.run.get("job"),
                created=created or datetime.now(timezone.utc).isoformat(timespec="seconds"))
    return Built(meta, table, decisions, state.garbled)


def write(built: Built, path: str | Path) -> None:
    """Write the table file atomically (temporary file + rename)."""
    write_atomic(Path(path), built.to_bytes())


@dataclass(frozen=True)
class TableFile:
    """A table read back: its meta, its entries and the file's sha256."""

    path: Path
    meta: dict[str, Any]
    table: dict[str, list[dict[str, Any]]]
    sha256: str


def parse(data: bytes, path: str | Path) -> TableFile:
    """Parse a table file's bytes; raises LookupTableError when it is not a table."""
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LookupTableError(f"{path}: not JSON ({exc})") from None
    except RecursionError:
        raise LookupTableError(f"{path}: nested deeper than a JSON reader accepts: not a "
                               "GEMM table") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict) \
            or not isinstance(doc.get("table"), dict):
        raise LookupTableError(
            f"{path}: not a GEMM table: expected {{\"meta\": {{...}}, \"table\": "
            "{...}}, as written by `titan-rocm tune table`"
        )
    for key, entries in doc["table"].items():
        if not isinstance(entries, list) or not all(
                isinstance(e, dict) and isinstance(e.get("template_id"), str) for e in entries):
            raise LookupTableError(f"{path}: entry {key!r} is not a list of objects with a "
                             "template_id")
    return TableFile(Path(path), doc["meta"], doc["table"], hashlib.sha256(data).hexdigest())


def read(path: str | Path) -> TableFile:
    """Read a table file; raises LookupTableError when unreadable or not a table."""
    try:
        data = read_regular(path)  # a FIFO is refused, never waited on
    except OSError as exc:
        raise LookupTableError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse(data, path)


def meta_mismatches(meta: dict[str, Any], env: dict[str, Any]) -> list[str]:
    """How a table's meta differs from the running device and software (empty: it fits)."""
    return [f"{name}: table {meta.get(name)!r}, running {env.get(name)!r}"
            for name in META_FIELDS if meta.get(name) != env.get(name)]


def coverage(table: TableFile, problem_keys: list[list[str]]) -> dict[str, Any]:
    """How many problems (each given by its call keys) the table answers."""
    device_key = table.meta.get("device_key")
    covered = [keys for keys in problem_keys
               if any(full_key(device_key, k) in table.table or k in table.table for k in keys)]
    missing = [keys[0] for keys in problem_keys if keys not in covered]
    return {"problems": len(problem_keys), "covered": len(covered), "missing": missing}


def problems_coverage(table_path: str | Path, problems_path: str | Path,
                      model: str | None = None, flavor: str | None = None) -> dict[str, Any]:
    """How many of a job's collected problems a table answers (``titan-rocm plan``);
    LookupTableError or ProblemsError for a file that cannot be read or does not match."""
    from titan_rocm.tuned_gemms import problems as problems_module

    found = problems_module.read(problems_path)
    job = found.job
    for name, want in (("model", model), ("flavor", flavor)):
        if want is not None and job.get(name) not in (None, want):
            raise problems_module.ProblemsError(
                f"{problems_path} was collected from {name} {job.get(name)!r}, this job has "
                f"{want!r}: collect it from this job")
    result = coverage(read(table_path), [list(p.keys) for p in found.problems])
    result["problems_file"] = str(problems_path)
    result["job"] = job
    return result
