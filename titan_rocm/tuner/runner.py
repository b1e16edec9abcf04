"""``tune run``'s processes: main, one worker per GPU, one minesweeper per worker, one writer.

Main and the workers stay torch-free so a hung or crashed candidate only takes its minesweeper down;
the writer acknowledges ``started`` before the candidate runs, so a resume always knows."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue as queue_module
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from titan_rocm.numbers import DEVICES, Bounds, refusal
from titan_rocm.progress import Progress
from titan_rocm.tuned_gemms.problems import FORMAT, ProblemsFile
from titan_rocm.tuned_gemms.records import (
    QUARANTINE_ERROR,
    STATUSES,
    Appender,
    State,
    load_state,
)
from titan_rocm.tuner.minesweeper import EXIT_RETIRED

_SPAWN = multiprocessing.get_context("spawn")


class RunError(ValueError):
    """The run cannot start or continue; the message says why (exit 2)."""


@dataclass(frozen=True)
class Options:
    """How ``tune run`` checks candidates."""

    timeout: float = 30.0
    """Seconds a candidate may take to run once, and again to be timed."""
    compile_timeout: float = 900.0
    """Seconds a problem may take to compile its candidates, and a candidate to load."""
    startup_timeout: float = 600.0
    """Seconds a minesweeper may take to initialise its device (never counts as ``timeout``)."""
    fudge: float = 3.0
    search_space: str = "default"
    backends: str = "ATEN,TRITON"
    settings: dict[str, Any] = field(default_factory=dict)


def parse_gpus(text: str, devices: Bounds = DEVICES) -> tuple[int, ...] | str:
    """``--gpus``: ``all``, or distinct device indices; raises ValueError naming the value."""
    return devices.parse_many(text, "--gpus", sep=",", distinct=True, words=("all",),
                              form="all, or device indices separated by commas, each once",
                              )  # type: ignore[return-value]


def device_slots(gpus: str | tuple[int, ...]) -> list[str | None]:
    """``CUDA_VISIBLE_DEVICES`` per worker for ``--gpus`` (None: CPU); RunError for missing devices.
    """
    import torch

    text = gpus if isinstance(gpus, str) else ",".join(map(str, gpus))
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        wanted = parse_gpus(text) if count == 0 else parse_gpus(text, Bounds(int, 0, count - 1))
    except ValueError as exc:
        raise RunError(str(exc)) from None
    if count == 0:
        if wanted != "all":
            raise RunError(refusal("--gpus", text, "all (this machine has no GPU: the CPU)"))
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    physical = [x.strip() for x in visible.split(",")] if visible else \
        [str(i) for i in range(count)]
    if wanted == "all":
        return physical[:count]
    return [physical[int(i)] for i in wanted]


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """End this child when its parent dies, even by ``kill -9`` (``PR_SET_PDEATHSIG``)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass  # no prctl in this libc: the orphan check below still runs
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)


def _writer(path: str, records: Any, inbox: Any, fail_after: int | None = None) -> None:
    die_with_parent()
    appender = Appender(path, fail_after)
    try:
        while True:
            item = records.get()
            if item is None:
                return
            record, ack = item
            try:
                appender.write(record)
            except OSError as exc:
                inbox.put(("writer_failed", None, exc.strerror or str(exc)))
                return
            if ack is not None:
                inbox.put(("written", ack))
    finally:
        appender.close()


class _Minesweeper:
    def __init__(self, options: Options) -> None:
        self.conn, child = _SPAWN.Pipe()
        self.process = _SPAWN.Process(target=_minesweeper_main, args=(child, asdict(options)),
                                      name="titan-rocm-minesweeper")
        self.process.start()
        child.close()

    def stop(self) -> None:
        """End it by asking, so its torch's semaphores are unlinked (a SIGKILL leaves a "leaked
        semaphore" warning as the run's last line); killed after 10 s."""
        if self.process.is_alive():
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
            self.process.join(10)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(5)
        self.conn.close()


def _minesweeper_main(conn: Any, options: dict[str, Any]) -> None:
    die_with_parent()
    from titan_rocm.tuner import minesweeper

    minesweeper.main(conn, options)


def _exit_fields(code: int | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"exit": code}
    if code is not None and code < 0:
        try:
            fields["signal"] = signal.Signals(-code).name
        except ValueError:
            pass
    return fields


class _Worker:
    def __init__(self, slot: int, inbox: Any, orders: Any, options: Options) -> None:
        self.slot, self.inbox, self.orders, self.options = slot, inbox, orders, options
        self.ms: _Minesweeper | None = None

    def send(self, *message: Any) -> None:
        self.inbox.put((message[0], self.slot, *message[1:]))

    def minesweeper(self) -> _Minesweeper | None:
        if self.ms is not None and self.ms.process.is_alive():
            return self.ms
        ms = _Minesweeper(self.options)
        if not ms.conn.poll(self.options.startup_timeout):
            ms.kill()
            self.send("worker_failed", f"minesweeper not ready in {self.options.startup_timeout}s")
            return None
        try:
            message = ms.conn.recv()
        except EOFError:
            ms.process.join(5)
            self.send("worker_failed", f"minesweeper died starting ({ms.process.exitcode})")
            return None
        if message[0] != "ready":
            ms.kill()
            self.send("worker_failed", f"minesweeper cannot tune: {message[1]}")
            return None
        self.send("ready", message[1], message[2])
        self.ms = ms
        return ms

    def tune(self, index: int, problem: dict[str, Any], skip: set[str]) -> None:
        failures = 0
        while True:
            ms = self.minesweeper()
            if ms is None:
                return
            ms.conn.send(("problem", index, problem, sorted(skip)))
            outcome, detail = self.follow(ms, skip)
            if outcome == "done":
                self.send("problem_done", problem["key"], detail)
                return
            if outcome == "progress":
                failures = 0
                continue
            failures += 1
            if failures >= 2:
                self.send("problem_done", problem["key"], detail)
                return

    def _result(self, record: dict[str, Any], skip: set[str], **fields: Any) -> None:
        skip.add(record["task"])
        self.send("result", {**record, **fields})

    def follow(self, ms: _Minesweeper, skip: set[str]) -> tuple[str, str | None]:
        o = self.options
        current: dict[str, Any] | None = None
        phase, deadline, ran_at = "compile", time.monotonic() + o.compile_timeout, 0.0
        while True:
            if not ms.conn.poll(max(0.0, deadline - time.monotonic())):
                ms.kill()
                self.ms = None
                if current is None:
                    return "stuck", f"compiling the problem took over {o.compile_timeout}s"
                if phase == "load":
                    self._result(current, skip, status="compile_error",
                                 error=f"loading took over {o.compile_timeout}s")
                else:
                    self._result(current, skip, status="hang",
                                 elapsed_s=round(time.monotonic() - ran_at, 3),
                                 error=f"killed after --timeout {o.timeout}s ({phase})")
                return "progress", None
            try:
                message = ms.conn.recv()
            except (EOFError, OSError):
                ms.process.join(10)
                code = ms.process.exitcode
                self.ms = None
                if current is None:
                    if code == EXIT_RETIRED:
                        return "progress", None
                    return "died", f"minesweeper died compiling the problem ({code})"
                self._result(current, skip, status="crash", **_exit_fields(code),
                             elapsed_s=round(time.monotonic() - ran_at, 3) if ran_at else None)
                return "progress", None
            kind = message[0]
            if kind == "tasks":
                self.send("tasks", *message[1:])
            elif kind == "started":
                current = message[1]
                self.send("started", current)
                while True:  # the record must be on disk before the candidate runs
                    order = self.orders.get()
                    if order == ("go", current["task"]):
                        break
                    if order == ("stop",):  # the run ends (its writer failed): run nothing
                        ms.stop()
                        raise SystemExit(0)
                ms.conn.send(("go",))
                phase, deadline = "load", time.monotonic() + o.compile_timeout
            elif kind == "loaded":
                phase, ran_at = "run", time.monotonic()
                deadline = ran_at + o.timeout
            elif kind == "checked":
                phase, deadline = "time", time.monotonic() + o.timeout
            elif kind == "result":
                self._result(message[1], skip)
                current, phase = None, "compile"
                deadline = time.monotonic() + o.compile_timeout
            elif kind == "problem_done":
                return "done", message[1]


def _worker_main(slot: int, device: str | None, inbox: Any, orders: Any,
                 options: dict[str, Any]) -> None:
    die_with_parent()
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    worker = _Worker(slot, inbox, orders, Options(**options))
    try:
        while True:
            order = orders.get()
            if order[0] == "stop":
                return
            if order[0] == "problem":
                worker.tune(order[1], order[2], set(order[3]))
    finally:
        if worker.ms is not None:
            worker.ms.stop()


@dataclass
class _Slot:
    device: str | None
    orders: Any = None
    process: Any = None
    problem: int | None = None


class Main:
    """The main process of ``tune run``."""

    def __init__(self, problems: ProblemsFile, output: Path, slots: list[str | None],
                 options: Options, progress: bool | None, retry_quarantined: bool = False,
                 fail_after: int | None = None) -> None:
        self.problems, self.output, self.options = problems, output, options
        self.state = load_state(output)
        self.slots = [_Slot(d) for d in slots]
        self.tty = progress
        self.progress: Progress | None = None
        self.retry_quarantined = retry_quarantined
        self.fail_after = fail_after
        self.inbox: Any = _SPAWN.Queue()
        self.records: Any = _SPAWN.Queue()
        self.writer: Any = None
        self.failed: str | None = None
        self.problem_errors: dict[str, str] = {}

    # -- records ---------------------------------------------------------------------------
    def write(self, record: dict[str, Any], ack: Any = None) -> None:
        self.state.add(record)
        self.records.put((record, ack))

    def check_resume(self) -> None:
        """Refuse another problems file's results, and a file that is not results."""
        run = self.state.run
        if run is None and self.output.exists() and self.output.stat().st_size > 0:
            raise RunError(
                f"{self.output} exists but is not a results file of `tune run` (no run record"
                + (f"; {self.state.garbled} line(s) that are not records" if self.state.garbled
                   else "") + "); refusing to append to it: write to a new -o")
        if run is not None and run.get("problems_sha256") != self.problems.sha256:
            job = (run.get("job") or {}).get("id")
            raise RunError(
                f"{self.output} was started for another problems file (sha256 "
                f"{str(run.get('problems_sha256'))[:12]}..., job {job}); resume it with that "
                "file, or write to a new -o")

    def header(self) -> None:
        if self.state.run is None:
            self.write({"type": "run", "format": FORMAT, "problems_sha256": self.problems.sha256,
                        "problems": [p.key for p in self.problems.problems],
                        "job": self.problems.job, "options": asdict(self.options),
                        "created": datetime.now(timezone.utc).isoformat(timespec="seconds")})

    def retry(self) -> int:
        """Requeue the quarantined tasks, each with a ``retry`` record; return how many."""
        tasks = self.state.quarantined()
        for task in tasks:
            self.write({"type": "retry", "task": task})
        return len(tasks)

    def finished(self, key: str) -> bool:
        record = self.state.problems.get(key)
        if record is None:
            return False
        if record.get("error"):
            return True
        return all(t in self.state.results for t in record.get("tasks", []))

    def skip_for(self, key: str) -> set[str]:
        """Terminal tasks of ``key``; tasks started twice get their ``crash`` record now."""
        for task in self.state.started_twice():
            record = self._candidate(key, task)
            if record is not None:
                self.write({**record, "type": "result", "status": "crash",
                            "quarantined": True, "error": QUARANTINE_ERROR})
        return {t for t, r in self.state.results.items() if r.get("key") == key}

    def _candidate(self, key: str, task: str) -> dict[str, Any] | None:
        problem = self.state.problems.get(key) or {}
        for record in problem.get("candidates", []):
            if record.get("task") == task:
                return record
        return None

    # -- processes ---------------------------------------------------------------------------
    def start_worker(self, index: int) -> None:
        slot = self.slots[index]
        slot.orders = _SPAWN.Queue()
        slot.process = _SPAWN.Process(
            target=_worker_main, name=f"titan-rocm-tune-worker-{index}",
            args=(index, slot.device, self.inbox, slot.orders, asdict(self.options)))
        slot.process.start()

    def dispatch(self, pending: list[int]) -> None:
        for i, slot in enumerate(self.slots):
            if slot.problem is None and pending:
                if slot.process is None or not slot.process.is_alive():
                    self.start_worker(i)
                slot.problem = pending.pop(0)
                problem = self.problems.problems[slot.problem]
                slot.orders.put(("problem", slot.problem, problem.to_dict(),
                                 sorted(self.skip_for(problem.key))))

    def handle(self, message: tuple[Any, ...], pending: list[int]) -> None:
        kind, slot = message[0], message[1]
        if kind == "ready":
            env = message[3]
            if env not in self.state.envs:
                self.write({"type": "env", "env": env})
        elif kind == "tasks":
            key, keys, candidates = message[2], message[3], message[4]
            problem = self.problems.problems[self.slots[slot].problem or 0]
            self.write({"type": "problem", "key": key, "op": problem.op, "keys": keys,
                        "tasks": [c["task"] for c in candidates], "candidates": candidates})
        elif kind == "started":
            self.write({"type": "started", **message[2]}, ack=(slot, message[2]["task"]))
        elif kind == "written":
            target, task = message[1]
            self.slots[target].orders.put(("go", task))
        elif kind == "result":
            self.write({"type": "result", **message[2]})
            self.show(0)
        elif kind == "problem_done":
            key, error = message[2], message[3]
            if error:
                self.problem_errors[key] = error
                record = dict(self.state.problems.get(key) or {"key": key, "tasks": []})
                record.update(type="problem", error=error)
                self.write(record)
                print(f"titan-rocm tune: problem {key}: {error}", file=sys.stderr)
            self.slots[slot].problem = None
            self.show(1)
        elif kind == "writer_failed":
            self.failed = (
                f"cannot write to {self.output}: {message[2]}; the run stopped, and the file "
                "holds every record written before (no cut line): make room and run the same "
                "command again to resume")
        elif kind == "worker_failed":
            self.failed = f"worker {slot} (device {self.slots[slot].device}): {message[2]}"

    def counts_text(self) -> str:
        """``pass 12, mismatch 1``: the results so far by status."""
        counts = self.state.counts()
        tasks = sum(len(p.get("tasks", [])) for p in self.state.problems.values())
        parts = ", ".join(f"{s} {counts[s]}" for s in STATUSES if counts[s])
        return (f"{len(self.state.results)} of {tasks} enumerated task(s) have a result: "
                f"{parts or 'none yet'}")

    def show(self, problems_done: int) -> None:
        """Progress over the problems of this run (a total fixed at the start)."""
        if self.progress is not None:
            self.progress.update(problems_done, self.counts_text())

    def run(self) -> int:
        self.check_resume()
        self.writer = _SPAWN.Process(target=_writer, name="titan-rocm-tune-writer",
                                     args=(str(self.output), self.records, self.inbox,
                                           self.fail_after))
        self.writer.start()
        try:
            self.header()
            if self.retry_quarantined:
                count = self.retry()
                print(f"titan-rocm tune: re-trying {count} quarantined task(s)", file=sys.stderr)
            for problem in self.problems.problems:
                if not problem.tunable and problem.key not in self.state.problems:
                    self.write({"type": "problem", "key": problem.key, "op": problem.op,
                                "keys": list(problem.keys), "tasks": [],
                                "error": f"{problem.op}: not tuned (no reference for this op "
                                         "yet); training uses ATen for it"})
            pending = [i for i, p in enumerate(self.problems.problems)
                       if not self.finished(p.key)]
            if self.state.garbled:
                print(f"titan-rocm tune: {self.output}: skipped {self.state.garbled} garbled "
                      "line(s) (a write cut short); earlier records are kept", file=sys.stderr)
            self.progress = Progress(len(pending), "problem", "titan-rocm tune", tty=self.tty)
            with self.progress:
                self.loop(pending)
        finally:
            self.stop()
        print(f"titan-rocm tune: {self.counts_text()}", file=sys.stderr)
        if self.failed:
            print(f"titan-rocm tune: error: {self.failed}", file=sys.stderr)
            return 1
        return 0

    def loop(self, pending: list[int]) -> None:
        while (pending or any(s.problem is not None for s in self.slots)) and not self.failed:
            self.dispatch(pending)
            try:
                message = self.inbox.get(timeout=1.0)
            except queue_module.Empty:
                for i, slot in enumerate(self.slots):
                    if slot.process is not None and not slot.process.is_alive():
                        if slot.problem is not None:  # its problem goes back to the queue
                            pending.insert(0, slot.problem)
                            slot.problem = None
                        slot.process = None
                        self.start_worker(i)
                continue
            self.handle(message, pending)

    def stop(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.is_alive():
                slot.orders.put(("stop",))
        for slot in self.slots:
            if slot.process is not None:
                slot.process.join(10)
                if slot.process.is_alive():
                    slot.process.kill()
        # Drain what workers said while stopping, then close the writer.
        while True:
            try:
                message = self.inbox.get(timeout=0.2)
            except queue_module.Empty:
                break
            if message[0] == "result" and self.writer.is_alive():
                self.write({"type": "result", **message[2]})
        self.records.put(None)
        if self.writer is not None:
            self.writer.join(30)


def run(problems: ProblemsFile, output: Path, gpus: str | tuple[int, ...] = "all",
        options: Options | None = None, progress: bool | None = None,
        retry_quarantined: bool = False) -> int:
    """Tune every problem, appending to (resuming) ``output``; return the exit code. RunError
    for ``--gpus`` not valid here, or an ``output`` of other problems or not results."""
    from titan_rocm.testing.faults import disk_full_after

    options = options or Options(settings=problems.settings)
    slots = device_slots(gpus)
    main = Main(problems, output, slots, options, progress, retry_quarantined,
                disk_full_after())
    return main.run()


def summary(state: State) -> dict[str, Any]:
    """Counts of a results state, for ``--json`` and the final line."""
    return {"results": dict(Counter(r["status"] for r in state.results.values())),
            "problems": len(state.problems), "garbled_lines": state.garbled,
            "quarantined": len(state.quarantined())}
