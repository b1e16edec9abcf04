"""``tune`` never destroys a file: an output that is an input (also through a link) or an
existing file that is not its own kind is refused; a full disk ends ``tune run`` with a
sentence, the results file whole and resumable; ``kill -9`` of the main process takes its
children with it; quarantined tasks can be re-tried (docs/validated-tuning.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_tuning import _env, _results, _tune, problems_file  # noqa: F401 - the fixture

from titan_rocm.cli import main as cli
from titan_rocm.tuned_gemms import records

REPO = Path(__file__).resolve().parents[3]


def _links(tmp_path: Path, target: Path) -> list[Path]:
    sym, hard = tmp_path / "sym", tmp_path / "hard"
    sym.symlink_to(target)
    os.link(target, hard)
    return [target, sym, hard]


def test_tune_run_refuses_an_output_that_is_its_problems_file(
        problems_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    copy = tmp_path / "problems.jsonl"
    copy.write_bytes(problems_file.read_bytes())
    before = copy.read_bytes()
    for out in _links(tmp_path, copy):
        assert cli(["tune", "run", str(copy), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"is the input {copy} (the same file)" in err and "Traceback" not in err
        assert copy.read_bytes() == before


def test_tune_run_never_appends_to_a_file_that_is_not_its_results(
        problems_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    for data in (os.urandom(4096), b'{"type": "problem", "key": "x"}\n', b"notes\n"):
        out = tmp_path / "r.jsonl"
        out.write_bytes(data)
        assert cli(["tune", "run", str(problems_file), "-o", str(out)]) == 2
        assert "is not a results file of `tune run`" in capsys.readouterr().err
        assert out.read_bytes() == data


def _results_file(tmp_path: Path) -> Path:
    results = tmp_path / "r.jsonl"
    appender = records.Appender(results)
    appender.write({"type": "run", "problems": ["K+mm"], "job": {"id": "j"}})
    appender.close()
    return results


def test_tune_table_refuses_to_overwrite_its_results_or_a_stranger(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = _results_file(tmp_path)
    before = results.read_bytes()
    for out in _links(tmp_path, results):
        assert cli(["tune", "table", str(results), "-o", str(out)]) == 2
        assert "(the same file)" in capsys.readouterr().err
        assert results.read_bytes() == before
    stranger = tmp_path / "notes.json"
    stranger.write_text('{"my": "notes"}')
    assert cli(["tune", "table", str(results), "-o", str(stranger)]) == 2
    assert "is not a GEMM table" in capsys.readouterr().err
    assert stranger.read_text() == '{"my": "notes"}'
    folder = tmp_path / "dir"
    folder.mkdir()
    assert cli(["tune", "table", str(results), "-o", str(folder)]) == 2
    assert "is a directory, not a regular file" in capsys.readouterr().err


def test_tune_table_names_a_fifo_and_reads_a_deep_line_as_garbled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert cli(["tune", "table", str(fifo), "--check"]) == 2
    err = capsys.readouterr().err
    assert "named pipe (FIFO)" in err and "no such file" not in err
    results = _results_file(tmp_path)
    with results.open("a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    assert records.load_state(results).garbled == 1
    assert cli(["tune", "table", str(results), "--check"]) == 2  # no RecursionError
    assert "no 'env' record" in capsys.readouterr().err


def test_a_failed_append_leaves_no_cut_line(tmp_path: Path) -> None:
    results = _results_file(tmp_path)
    appender = records.Appender(results, fail_after=1)
    appender.write({"type": "env", "env": {}})
    with pytest.raises(OSError, match="No space left"):
        appender.write({"type": "result", "task": "t", "status": "pass"})
    appender.close()
    kept, garbled = records.read_records(results)
    assert garbled == 0 and [r["type"] for r in kept] == ["run", "env"]


def test_a_quarantined_task_stays_out_until_a_retry_record() -> None:
    state = records.State()
    state.add({"type": "result", "task": "t", "status": "crash", "quarantined": True,
               "error": records.QUARANTINE_ERROR})
    state.add({"type": "result", "task": "u", "status": "crash", "error": "signal"})
    assert state.quarantined() == ["t"]
    state.add({"type": "retry", "task": "u"})  # a real crash is not quarantined: it stays
    state.add({"type": "retry", "task": "t"})
    assert list(state.results) == ["u"] and state.quarantined() == []
    assert state.started["t"] == 0


# -- real tune runs (slow: minesweepers) ----------------------------------------------------

@pytest.mark.slow
def test_a_full_disk_ends_the_run_with_a_sentence_and_resumes(
        problems_file: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "r.jsonl"
    full = _tune(problems_file, out, TITAN_ROCM_TUNE_DISK_FULL_AFTER="6")
    assert full.returncode == 1, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    assert f"cannot write to {out}: No space left on device" in full.stderr
    # The sentence is the last line: the minesweepers are asked to stop, not killed, so none
    # leaves a semaphore for the resource tracker to warn about after it.
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith(f"titan-rocm tune: error: cannot write to {out}"), last
    kept, garbled = records.read_records(out)
    assert garbled == 0 and len(kept) == 6
    again = _tune(problems_file, out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len({r["task"] for r in _results(out)}) == 5


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and int(entry.name) not in found:
                found.add(int(entry.name))
                todo.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_the_main_process_takes_its_children(problems_file: Path,  # noqa: F811
                                                       tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "titan_rocm.cli", "tune", "run", str(problems_file), "-o",
           str(out), "--backends", "ATEN,CPP", "--timeout", "60"]
    env = _env(tmp_path, TITAN_ROCM_TUNE_FAULTS="hang:cpp::bmm@0")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
                r["type"] == "started" and r["template_id"] == "cpp::bmm"
                for r in records.read_records(out)[0]):
            time.sleep(0.2)
        children = _descendants(proc.pid)
        # writer, worker, minesweeper (and multiprocessing's resource tracker)
        assert len(children) >= 3, children
        os.kill(proc.pid, signal.SIGKILL)  # the main process alone, not its group
        proc.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in children):
            time.sleep(0.2)
        assert not [p for p in children if _alive(p)]
    finally:
        for pid in _descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_quarantined_tasks_are_counted_and_re_tried_on_request(
        problems_file: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "r.jsonl"
    assert _tune(problems_file, out).returncode == 0
    kept = records.read_records(out)[0]
    victim = next(r for r in kept if r["type"] == "result" and r["template_id"] == "aten::bmm")
    # As two kills during its run leave it: two started records, no result.
    lines = [json.dumps(r) for r in kept if r.get("task") != victim["task"]]
    started = {k: v for k, v in victim.items() if k not in ("status", "time_ms", "type")}
    lines += [json.dumps({**started, "type": "started"})] * 2
    out.write_text("\n".join(lines) + "\n")
    held = _tune(problems_file, out)
    assert held.returncode == 0, held.stderr[-3000:]
    assert "1 task(s) quarantined" in held.stdout and "--retry-quarantined" in held.stdout
    assert records.load_state(out).results[victim["task"]]["status"] == "crash"
    retried = _tune(problems_file, out, "--retry-quarantined", "--json")
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert json.loads(retried.stdout)["quarantined"] == 0
    assert records.load_state(out).results[victim["task"]]["status"] == "pass"


def test_problems_and_table_readers_refuse_deep_json(tmp_path: Path) -> None:
    from titan_rocm.tuned_gemms import problems as problems_module
    from titan_rocm.tuned_gemms import table as table_module

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(problems_module.ProblemsError, match="nested deeper"):
        problems_module.read(deep)
    with pytest.raises(table_module.LookupTableError, match="nested deeper"):
        table_module.read(deep)
