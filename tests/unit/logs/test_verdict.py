"""One run verdict (ok / diverged / incomplete / empty) feeds check-log and bench-summary:
each class of log gets the same verdict from both, with each tool's exit code."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from titan_rocm.cli import main
from titan_rocm.logs.parse import (
    MAX_LINE_BYTES,
    TAIL_BYTES,
    UnreadableLog,
    parse_file,
    parse_lines,
    parse_text,
    sniff_binary,
)
from titan_rocm.logs.verdict import verdict_of

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def tt(step: int, loss: float | str = 5.0, grad_norm: float | str = 1.0, rank: int | None = None,
       tps: str = "1,000") -> str:
    """A TorchTitan 0.2.2 metric line (without colours)."""
    prefix = f"[rank{rank}]:" if rank is not None else ""
    return (
        f"{prefix}[titan] 2026-11-30 04:37:04,679 - root - INFO - step: {step:2d}  "
        f"loss: {loss}  grad_norm: {grad_norm}  memory: 3.00GiB(2.00%)  tps: {tps}  "
        "tflops: 10.00  mfu: 1.00%"
    )


STEPS = [tt(1, 8.0), tt(10, 6.0), tt(20, 5.0)]
TRACEBACK = [
    "[rank0]: Traceback (most recent call last):",
    '[rank0]:   File "/x/torchtitan/train.py", line 675, in train',
    "[rank0]:     self.train_step(data_iterator)",
]
# One line (or a few) per class of crash, as the process prints it.
CRASHES: dict[str, list[str]] = {
    "Python traceback": [*TRACEBACK, "[rank0]: RuntimeError: boom"],
    "out of memory": ["[rank0]: torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2GiB"],
    "segmentation fault": ["Segmentation fault (core dumped)"],
    "fatal error": ["terminate called after throwing an instance of 'c10::Error'"],
    "killed": ["Killed"],
    "torchrun child failure": [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "],
    "NCCL/RCCL error": [
        "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1"],
    "GPU error": ["Memory access fault by GPU node-2 (Agent handle: 0x1) on address 0x7f. "
                  "Reason: Page not present or supervisor privilege."],
}


def write(tmp_path: Path, lines: list[str], name: str = "run.log") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def both(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[dict, dict]:
    """check-log's and bench-summary's --json for one file (each with its exit code)."""
    check_code = main(["check-log", "--json", str(path)])
    check = json.loads(capsys.readouterr().out)["files"][0]
    bench_code = main(["bench-summary", "--json", "--warmup", "1", str(path)])
    bench = json.loads(capsys.readouterr().out)
    assert (check["exit_code"], bench["exit_code"]) == (check_code, bench_code)
    assert check["verdict"] == bench["verdict"]  # one verdict feeds both tools
    return check, bench


# (name, lines, verdict label, check-log exit, bench-summary exit)
CLASSES = [
    ("clean", STEPS, "ok", 0, 0),
    ("non-finite loss", [*STEPS, tt(30, "nan", "nan")], "diverged at step 30", 1, 1),
    ("guard stop message only", [
        "titan-rocm divergence guard: training diverged at step 7: loss = nan, grad_norm = 1.5"
        " (found at log step 10). Training stopped"], "diverged at step 7", 1, 1),
    ("crash after finite steps", [*STEPS, *CRASHES["out of memory"]], "incomplete", 0, 1),
    ("crash before the first step", CRASHES["Python traceback"], "incomplete", 2, 1),
    ("validation lines only", ["validate step: 20  loss:  6.9876  memory: 1.00GiB(1.00%)"],
     "incomplete", 2, 1),
    ("no metric line", ["hello", "world"], "empty", 2, 2),
    ("warning traceback the run survived", [tt(1), *CRASHES["Python traceback"], tt(10), tt(20)],
     "ok", 0, 0),
    ("crash after Training completed", [
        *STEPS, "[titan] - root - INFO - Training completed", *CRASHES["NCCL/RCCL error"]],
     "ok", 0, 0),
]


@pytest.mark.parametrize(("name", "lines", "label", "check_exit", "bench_exit"), CLASSES,
                         ids=[c[0] for c in CLASSES])
def test_each_class_gets_one_verdict_from_both_tools(
    capsys, tmp_path, name, lines, label, check_exit, bench_exit
) -> None:
    check, bench = both(capsys, write(tmp_path, lines))
    assert check["verdict"]["label"] == label
    assert (check["exit_code"], bench["exit_code"]) == (check_exit, bench_exit)
    assert bench["valid"] is (bench_exit == 0)
    if not bench["valid"]:
        assert bench["reason"] and bench["tps"] is None


@pytest.mark.parametrize("kind", list(CRASHES))
def test_every_crash_kind_ends_the_run_and_is_named(capsys, tmp_path, kind: str) -> None:
    path = write(tmp_path, [*STEPS, *CRASHES[kind]])
    check, bench = both(capsys, path)
    crash = check["verdict"]["crash"]
    assert crash["kind"] == kind and check["verdict"]["status"] == "incomplete"
    assert bench["reason"].startswith(
        "the run did not finish: after its last logged training step 20 the log ends in a "
        f"crash ({kind} at line ")
    assert bench["reason"].endswith("A run that did not finish is not a valid benchmark.")
    main(["check-log", str(path)])
    out = capsys.readouterr().out
    assert f"{path}: incomplete: the run did not finish" in out
    assert "Every loss and grad norm logged before it is finite; 3 training step(s)" in out
    # The same crash with a training step after it was a warning the run survived.
    survived = verdict_of([parse_text("\n".join([*STEPS, *CRASHES[kind], tt(30)]))])
    assert survived.status == "ok" and survived.crash is None


def test_a_traceback_is_named_by_its_exception_line() -> None:
    log = parse_text("\n".join([*STEPS, *TRACEBACK, "[rank0]:", "[rank0]: KeyError: ''",
                                "[rank0]: Traceback (most recent call last):", "ValueError: x"]))
    assert log.crash is not None and log.crash.text == "KeyError: ''"
    assert log.crash.line == 4 and log.crash.rank == 0
    # a traceback cut short: an exception line far below belongs to something else
    cut = parse_text("\n".join([*STEPS, "Traceback (most recent call last):",
                                 *["noise"] * 500, "ValueError: unrelated"]))
    assert cut.crash is not None and cut.crash.text == "Traceback (most recent call last):"


def test_startup_failure_of_the_stored_stock_logs() -> None:
    """What the first H200 batch's stock runs logged (`KeyError: ''` at start-up)."""
    text = "\n".join([
        "[rank0]:[titan] 2026-11-30 03:41:59 - root - INFO - Building llama3 debugmodel",
        "[rank0]:[rank0]: Traceback (most recent call last):",
        '[rank0]:[rank0]:   File "/tmp/site/torchtitan/protocols/model_converter.py", line 62',
        "[rank0]:[rank0]:     _registry_model_converter_cls[name] for name in converters",
        "[rank0]:[rank0]: KeyError: ''",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ])
    verdict = verdict_of([parse_text(text)])
    assert verdict.status == "incomplete" and verdict.train_steps == 0
    assert verdict.reason == (
        "the run crashed before its first training step (Python traceback at line 2, rank 0: "
        "\"KeyError: ''\").")


def test_pooled_files_one_crashed(capsys, tmp_path) -> None:
    r0 = write(tmp_path, [tt(s, rank=0) for s in (1, 10, 20)], "r0.log")
    r1 = write(tmp_path, [*(tt(s, rank=1) for s in (1, 10)), *CRASHES["killed"]], "r1.log")
    code = main(["bench-summary", "--json", str(r0), str(r1)])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["verdict"]["status"] == "incomplete"
    assert f"killed at line 3 of {r1}" in data["reason"]


# -- files that are not logs -----------------------------------------------------------------


def _not_regular(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "missing":
        pass
    elif kind == "no permission":
        path.write_text(tt(1))
        path.chmod(0)
    return path


@pytest.mark.parametrize(("kind", "said"), [
    ("fifo", "it is a named pipe (FIFO); titan-rocm reads regular log files only"),
    ("directory", "it is a directory"),
    ("missing", "No such file or directory"),
    ("no permission", "Permission denied"),
])
@pytest.mark.parametrize("tool", ["check-log", "bench-summary"])
def test_what_is_not_a_readable_regular_file_is_refused_without_blocking(
    capsys, tmp_path, monkeypatch, kind, said, tool
) -> None:
    if not hasattr(os, "mkfifo") and kind == "fifo":
        pytest.skip("no FIFOs on this platform")
    path = _not_regular(tmp_path, kind)
    if kind == "no permission" and os.geteuid() == 0:  # root reads any mode: let open() say no
        def refuse(*_: object, **__: object) -> int:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(os, "open", refuse)

    def hung(*_: object) -> None:
        raise AssertionError(f"{tool} blocked on a {kind}")

    # A guard against a hang (an open() of a FIFO blocks until a writer comes), not a timing.
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        code = main([tool, str(path)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out = capsys.readouterr().out
    assert code == 2 and f"cannot read {path}: {said}" in out, out


def test_a_fifo_is_refused_before_open(tmp_path, monkeypatch) -> None:
    """``os.stat`` decides; ``open`` is never called on a FIFO."""
    path = _not_regular(tmp_path, "fifo")
    monkeypatch.setattr(os, "open", lambda *a, **k: pytest.fail("opened a FIFO"))
    with pytest.raises(UnreadableLog, match="named pipe"):
        parse_file(path)


@pytest.mark.parametrize(("head", "what"), [
    (b"\x1f\x8b\x08\x00" + bytes(range(256)), "gzip-compressed data"),
    (b"\x28\xb5\x2f\xfd" + b"\x00" * 50, "zstd-compressed data"),
    (b"\x7fELF\x02\x01\x01" + b"\x00" * 100, "an executable (ELF)"),
    (bytes(range(256)) * 4, "binary data, not text"),
])
def test_binary_input_is_named(capsys, tmp_path, head: bytes, what: str) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(head)
    assert (sniff_binary(head) or "").startswith(what)
    code = main(["check-log", str(path)])
    out = capsys.readouterr().out
    assert code == 2 and f"{path}: empty: {path} is {what}" in out


def test_text_is_not_binary() -> None:
    assert sniff_binary((FIXTURES / "tt_cpu_clean.log").read_bytes()) is None
    assert sniff_binary(b"") is None


# -- streaming ---------------------------------------------------------------------------------

NOISE = "[rank0]:[titan] 2026-11-30 04:37:08,378 - root - WARNING - Dataset c4_test re-looped" * 2


@pytest.mark.slow
def test_the_file_reader_never_holds_the_whole_log(tmp_path) -> None:
    """A 20 MB log parses with a peak of a few MB of Python memory (it grew with the file when
    the reader read it whole: 3x the file size)."""
    path = tmp_path / "big.log"
    with path.open("w") as handle:
        for step in range(1, 1001):
            handle.write(tt(step) + "\n")
            handle.write((NOISE + "\n") * 120)
    size = path.stat().st_size
    assert size > 18e6
    tracemalloc.start()
    try:
        log = parse_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(log.train_records) == 1000 and log.lines == 1000 * 121
    assert peak < size / 8, (peak, size)


@pytest.mark.slow
def test_a_generator_of_lines_is_read_lazily() -> None:
    """parse_lines holds one chunk at a time: a 20 MB log made line by line by a generator
    parses in a few MB (a reader that joined or listed the lines would hold all 20 MB)."""
    noise = NOISE + "\n"
    total = 0

    def lines():
        nonlocal total
        for step in range(1, 1001):
            yield tt(step) + "\n"
            for _ in range(120):
                total += len(noise)
                yield noise

    tracemalloc.start()
    try:
        log = parse_lines(lines())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(log.train_records) == 1000 and total > 18e6
    assert peak < total / 8, (peak, total)


def test_an_overlong_line_is_cut_not_read_whole(tmp_path) -> None:
    """Past MAX_LINE_BYTES a physical line is read as its first MAX_LINE_BYTES and its last
    TAIL_BYTES (a metric line glued to the end of other output is there), the bytes between
    skipped and counted; the next line is read as usual, at its own number."""
    path = tmp_path / "long.log"
    path.write_bytes(b"x" * (2 * MAX_LINE_BYTES) + tt(1).encode() + b"\n" + tt(2).encode())
    log = parse_file(path)
    assert log.lines == 2 and [(r.step, r.line) for r in log.records] == [(1, 1), (2, 2)]
    assert log.skipped_bytes == MAX_LINE_BYTES + len(tt(1)) + 1 - TAIL_BYTES
    assert log.cut_lines == [1]


FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # each example writes its own file


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURE_OK)
@given(st.lists(st.sampled_from([
    tt(1).encode(), tt(2, "nan").encode(), b"\r\n", b"\n", b"\r", b"\x85", "\u2028".encode(),
    b"\xe2\x82", b"\xff", b"\x1b[31m", b"[rank1]:", b"Traceback (most recent call last):\n",
    b"KeyError: ''", b"Training completed", b"Killed\n", "é".encode(), b"\x00",
]), max_size=30).map(b"".join), st.sampled_from([7, 64, 1 << 18]))
@example(data=b"Training completed\n" + tt(1).encode(), block_bytes=1 << 18)  # a step after
@example(data=b"Killed\n" + tt(2, "nan").encode() + b"\r\nKilled", block_bytes=7)
def test_streamed_file_equals_the_text_parser(tmp_path_factory, data: bytes,
                                              block_bytes: int) -> None:
    """Reading a file block by block finds exactly what parsing its whole text finds."""
    from titan_rocm.logs import parse

    path = tmp_path_factory.mktemp("s") / "x.log"
    path.write_bytes(data)
    whole = parse_text(data.decode("utf-8", errors="replace"), source=str(path))
    block = parse._BLOCK_BYTES
    try:
        parse._BLOCK_BYTES = block_bytes  # small blocks: lines and markers across blocks
        streamed = parse_file(path)
    finally:
        parse._BLOCK_BYTES = block
    # repr: a NaN loss is not == itself
    assert repr((streamed.records, streamed.lines, streamed.crash, streamed.completed_line,
                 streamed.truncated)) == repr((whole.records, whole.lines, whole.crash,
                                               whole.completed_line, whole.truncated))


# -- fuzz: both tools, any text ---------------------------------------------------------------

LOG_PIECES = st.sampled_from([
    tt(1), tt(10, "nan"), tt(20, 4.0, "inf"), tt(30, tps="nan"), tt(40, tps="-1"),
    "validate step: 20  loss:  6.9", "step: 4  loss:", *CRASHES["Python traceback"],
    *CRASHES["out of memory"], "Killed", "Training completed", "KeyError: ''",
    "titan-rocm divergence guard: training diverged at step 7", " iteration 10/ 40 | lm loss: "
    "nan |", "[after training is done]", "[rank3]:", "memory (MB) | max reserved: inf",
])


@settings(max_examples=120, deadline=None, suppress_health_check=FIXTURE_OK)
@given(st.lists(st.one_of(LOG_PIECES, st.text(max_size=20)), max_size=25))
def test_both_tools_on_random_logs(tmp_path_factory, capsys, pieces: list[str]) -> None:
    """Never a traceback; exit 0/1/2; one verdict; strict JSON; sentences without 'None'."""
    path = tmp_path_factory.mktemp("f") / "x.log"
    path.write_text("\n".join(pieces), errors="surrogatepass")
    for tool in ("check-log", "bench-summary"):
        for extra in ([], ["--json"]):
            code = main([tool, *extra, str(path)])
            out = capsys.readouterr().out
            assert code in (0, 1, 2)
            if extra:
                json.loads(out)
                assert "NaN" not in out and "Infinity" not in out
            else:
                _assert_sentences(out)
    check, bench = both(capsys, path)
    if check["verdict"]["status"] == "diverged":
        assert check["exit_code"] == bench["exit_code"] == 1


def _assert_sentences(out: str) -> None:
    for line in out.splitlines():
        assert "None" not in line and not re.search(r": ?;|: $|on rank \d+: ?$", line), line


def test_messages_never_show_placeholders(capsys, tmp_path) -> None:
    """The messages of issue 17 item 9, on the inputs that produced them."""
    guard_only = write(tmp_path, ["titan-rocm divergence guard: training diverged at step 7"])
    for tool in ("check-log", "bench-summary"):
        assert main([tool, str(guard_only)]) == 1
        out = capsys.readouterr().out
        _assert_sentences(out)
        assert "diverged at step 7" in out and "no value in the message" in out
    assert main(["bench-summary", str(write(tmp_path, ["hello"]))]) == 2
    out = capsys.readouterr().out
    _assert_sentences(out)
    assert "steps parsed: 0\n" in out


def test_stat_modes_are_described() -> None:
    from titan_rocm.files import describe_mode

    assert describe_mode(stat.S_IFSOCK) == "a socket"
    assert describe_mode(stat.S_IFCHR) == "a device"
