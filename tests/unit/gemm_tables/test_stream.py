"""``titan-rocm gemm-tables``: tables are streamed (records read one at a time, memory flat),
listed rows are bounded, ``--json`` is JSON on every exit path, and a closed pipe is quiet."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import gemm_tables_memory
from tests.support.gemm_table_maker import AITER_COMPOSITION, make_table  # tests/ is on sys.path
from titan_rocm.cli import BROKEN_PIPE, main
from titan_rocm.gemm_tables import rules as rules_module
from titan_rocm.gemm_tables import table as table_module
from titan_rocm.gemm_tables.capture_safe import CaptureSafeError, capture_safe
from titan_rocm.gemm_tables.table import physical_lines, split_records

# The package exports a function named capture_safe: take the module itself.
capture_module = sys.modules["titan_rocm.gemm_tables.capture_safe"]


@pytest.fixture(autouse=True)
def _no_installed_aiter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rule holds unless a test says otherwise: an aiter installed on the machine
    running the tests must not change what they expect."""
    monkeypatch.setattr(rules_module, "installed_aiter_root", lambda: None)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200).map(lambda b: bytes(b"a,\"\r\n"[x % 5] for x in b)),
       cuts=st.lists(st.integers(0, 200), max_size=8))
def test_lines_read_in_chunks_are_the_lines_of_the_whole(data, cuts):
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    chunks = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert list(physical_lines(chunks)) == data.splitlines(keepends=True)


def test_a_record_longer_than_the_limit_is_refused_with_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(table_module, "MAX_RECORD_BYTES", 64)
    monkeypatch.setattr(table_module, "CHUNK_BYTES", 16)
    path = tmp_path / "t.csv"
    path.write_bytes(b"gfx,cu_num,libtype,solidx,kernelName\n" + b"x" * 200)
    with pytest.raises(CaptureSafeError, match=rf"{path}:2: a record longer than 64 bytes"):
        capture_safe([path], None, check=True, aiter="e4048607")
    with pytest.raises(table_module.GemmTableError, match="line 2: a record longer"):
        split_records(b'a\n"' + b"y\n" * 40)


def test_the_reader_holds_one_record_at_a_time(tmp_path, monkeypatch):
    # Structural guard for flat memory: the file is read in chunks, never whole.
    reads: list[int] = []
    real_open = table_module.os.fdopen

    def counting_fdopen(fd, mode="r"):
        handle = real_open(fd, mode)
        original = handle.read

        def read(size=-1):
            reads.append(size)
            return original(size)

        handle.read = read  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(table_module.os, "fdopen", counting_fdopen)
    path = tmp_path / "big_bf16_tuned_gemm.csv"
    make_table(path, {k: v * 4 for k, v in AITER_COMPOSITION.items()}, seed=3)
    assert path.stat().st_size > 4 * table_module.CHUNK_BYTES
    result = capture_safe([path], tmp_path / "out", aiter="e4048607")
    assert result.files[0].rows == 4 * 3338
    assert reads and all(0 < size <= table_module.CHUNK_BYTES for size in reads)


def test_listed_rows_are_bounded_and_the_rest_counted(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(capture_module, "MAX_NOTES", 5)
    path = tmp_path / "t_bf16_tuned_gemm.csv"
    make_table(path, {("gfx950", "opus", "splitk"): 8, ("gfx950", "asm", "splitk"): 4}, seed=1)
    other = tmp_path / "u_bf16_tuned_gemm.csv"
    make_table(other, {("gfx942", "asm", "splitk"): 3}, seed=2)
    code = main(["gemm-tables", "capture-safe", str(path), str(other), "--check",
                 "--aiter", "e4048607"])
    out = capsys.readouterr().out
    assert code == 1
    assert out.count(": unsafe: ") == 5
    assert "... 10 more unsafe row(s) not listed (the first 5 are); all are counted" in out
    assert "would remove 15 of 15 rows" in out
    main(["gemm-tables", "capture-safe", str(path), str(other), "--check", "--json",
          "--aiter", "e4048607"])
    report = json.loads(capsys.readouterr().out)
    files = report["files"]
    assert [len(f["removed_rows"]) for f in files] == [5, 0]
    assert [f["removed_rows_not_listed"] for f in files] == [7, 3]
    assert [f["removed"] for f in files] == [12, 3]


@pytest.mark.parametrize("kind", ["error", "interrupted"])
def test_json_is_printed_on_every_exit_path(capsys, tmp_path, monkeypatch, kind):
    path = tmp_path / "t.csv"
    path.write_text("not,a,table\n")
    if kind == "interrupted":
        make_table(path, {("gfx950", "opus", "splitk"): 2}, seed=1)

        def stop(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(capture_module, "read_table", stop)
    code = main(["gemm-tables", "capture-safe", str(path), "-o", str(tmp_path / "o"), "--json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["command"] == "gemm-tables"
    assert report["exit_code"] == code == (2 if kind == "error" else 130)
    assert report["error"] and report["error"] in err
    assert report["error"].startswith("interrupted") is (kind == "interrupted")
    assert not (tmp_path / "o").exists()  # a run that wrote nothing leaves no directory


def test_a_reader_closing_the_pipe_gets_no_traceback(tmp_path):
    path = tmp_path / "t_bf16_tuned_gemm.csv"
    make_table(path, {("gfx950", "asm", "splitk"): 3000}, seed=1)
    proc = subprocess.Popen([sys.executable, "-m", "titan_rocm.cli", "gemm-tables",
                             "capture-safe", str(path), "--check", "--aiter", "e4048607"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == BROKEN_PIPE  # 141, as every command (README)
    assert "Traceback" not in err


def test_memory_benchmark_runs_and_stores_its_figures(tmp_path):
    bench = gemm_tables_memory
    table = tmp_path / "t.csv"
    rows = bench.make_table(table, 20_000)
    assert 100 < rows < 200 and 20_000 <= table.stat().st_size < 21_000
    assert bench.main(["--sizes-mb", "0.02", "0.2", "--out", str(tmp_path / "r")]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert [f["exit"] for f in summary["figures"]] == [0, 0]
    assert summary["ratio"] > 0 and summary["import_only_mib"] > 0
    with pytest.raises(SystemExit):
        bench.main(["--sizes-mb", "nan"])


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_input_or_option_gives_a_traceback_and_json_stays_json(capsys, tmp_path, data):
    source = bytearray(
        b"gfx,cu_num,libtype,solidx,splitK,kernelName\n"
        b"gfx950,256,asm,5,13,_ZN5aiter39bf16gemm_fp32bf16_tn_64x64_splitk_cleanE\n"
        b"gfx942,80,opus,10201,0,opus_gemm_gfx942_splitk_p1\n"
        b",256,flydsl,1,4,flydsl_gemm2_abf16_wbf16_bf16_t16x64x256_split_k4_x_small_m_gfx950\n")
    for _ in range(data.draw(st.integers(0, 4))):
        pos = data.draw(st.integers(0, len(source) - 1))
        op = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if op == "set":
            source[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            source.insert(pos, data.draw(st.sampled_from(list(b',"\n\r\x00x\xff1'))))
        elif len(source) > 1:
            del source[pos]
    table = tmp_path / "t.csv"
    table.write_bytes(bytes(source))
    args = [str(table)]
    args += data.draw(st.sampled_from([["--check"], ["-o", str(tmp_path / "o")],
                                       ["-o", str(table)], []]))
    args += data.draw(st.sampled_from([[], ["--policy", "all-opus"], ["--policy", "x"]]))
    args += data.draw(st.sampled_from([[], ["--arch", "gfx950"], ["--arch", "gfx1"],
                                       ["--arch", ""]]))
    args += data.draw(st.sampled_from([[], ["--aiter", "main"], ["--aiter", "e4048607"],
                                       ["--aiter", "0.1.7"],
                                       ["--aiter", "absent"], ["--aiter", "nan"]]))
    as_json = data.draw(st.booleans())
    code = main(["gemm-tables", "capture-safe", *args, *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2) and "Traceback" not in err
    if as_json and out:
        report = json.loads(out)
        # a report carries "ok"; an error is the envelope, with its exit code
        assert report.get("ok") is True if code != 2 else report["exit_code"] == 2
