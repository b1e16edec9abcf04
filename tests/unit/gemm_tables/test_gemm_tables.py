"""Tests for ``titan-rocm gemm-tables capture-safe`` (titan_rocm.gemm_tables)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gemm_table_maker import (  # tests/ is on sys.path
    AITER_COMPOSITION,
    AITER_SPLITK_ZERO,
    HEADER,
    Row,
    make_batched_table,
    make_table,
    split_composition,
)
from titan_rocm import archs as archs_module
from titan_rocm.cli import main
from titan_rocm.files import PartialWrite, write_all
from titan_rocm.gemm_tables import rules as rules_module
from titan_rocm.gemm_tables.capture_safe import CaptureSafeError, capture_safe
from titan_rocm.gemm_tables.policy import in_splitk_range
from titan_rocm.gemm_tables.table import split_records


@pytest.fixture(autouse=True)
def _no_installed_aiter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rule holds unless a test says otherwise: an aiter installed on the machine
    running the tests must not change what they expect."""
    monkeypatch.setattr(rules_module, "installed_aiter_root", lambda: None)


# The rule as the issue states it, written out independently of the package: an opus
# row is split-K when its solidx lies in these half-open ranges of its gfx.
ISSUE_SPLITK_RANGES = {
    "gfx950": [(200, 300), (1200, 1300)],
    "gfx942": [(10200, 10300)],
}


def oracle_removed(path: Path, policy: str) -> list[int]:
    """Line numbers (1-based, header = 1) the issue's rule removes; tables without quotes."""
    removed = []
    with path.open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            ranges = ISSUE_SPLITK_RANGES.get(row["gfx"])
            if row["libtype"] != "opus" or ranges is None:
                continue
            solidx = int(row["solidx"])
            if policy == "all-opus" or any(lo <= solidx < hi for lo, hi in ranges):
                removed.append(line)
    return removed


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["gemm-tables", "capture-safe", *args])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code, out, err = run_cli(capsys, *args, "--json")
    return code, json.loads(out)


def row(gfx: str, cu: str, libtype: str, solidx: str, name: str, m: int = 1) -> str:
    return (
        f"{gfx},{cu},{m},256,5120,False,torch.bfloat16,torch.bfloat16,False,False,"
        f"{libtype},{solidx},0,7.9,{name},0.0,21.19,417.92"
    )


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# --- tables of our own making, shaped like aiter's ------------------------------------------

# Kinds of rows per table, like aiter's tables hold them: a gfx950 table with gfx1250 rows
# (the default table), gfx942-only model tables, gfx1250 opus beside gfx950 split-K rows.
TABLES = {
    "bf16_like_tuned_gemm.csv": {
        ("gfx950", "opus", "splitk"): 12, ("gfx950", "opus", "other"): 24,
        ("gfx950", "asm", "-"): 60, ("gfx950", "torch", "-"): 40, ("gfx950", "flydsl", "-"): 50,
        ("gfx1250", "triton", "-"): 40, ("gfx1250", "torch", "-"): 5},
    "gfx942_model_tuned_gemm.csv": {
        ("gfx942", "opus", "splitk"): 22, ("gfx942", "opus", "other"): 9,
        ("gfx942", "asm", "-"): 10, ("gfx942", "torch", "-"): 14, ("gfx942", "skinny", "-"): 2},
    "dsv3_like_tuned_gemm.csv": {
        ("gfx942", "opus", "splitk"): 1, ("gfx942", "opus", "other"): 3,
        ("gfx942", "torch", "-"): 100, ("gfx942", "triton", "-"): 2},
    "gfx1250_like_tuned_gemm.csv": {
        ("gfx1250", "opus", "safe-arch"): 111, ("gfx1250", "triton", "-"): 300,
        ("gfx950", "opus", "splitk"): 4, ("gfx950", "triton", "-"): 30},
}


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[Row]]]:
    """The TABLES, written once: name -> (path, rows with what the rule must decide)."""
    root = tmp_path_factory.mktemp("tables")
    made = {}
    for seed, (name, composition) in enumerate(TABLES.items()):
        path = root / name
        made[name] = (path, make_table(path, composition, seed=seed,
                                       splitk_zero={"gfx942": 5}))
    return made


def paths(tables: dict[str, tuple[Path, list[Row]]]) -> list[Path]:
    return [path for path, _ in tables.values()]


def test_exact_rows_removed(capsys, tmp_path, tables):
    table, rows = tables["bf16_like_tuned_gemm.csv"]
    code, report = run_json(capsys, str(table), "-o", str(tmp_path / "out"))
    assert code == 0
    lines = [r["line"] for r in report["files"][0]["removed_rows"]]
    assert lines == [row.line for row in rows if row.unsafe] and len(lines) == 12
    assert {r["arch"] for r in report["files"][0]["removed_rows"]} == {"gfx950"}
    code, report = run_json(
        capsys, str(table), "-o", str(tmp_path / "blunt"), "--policy", "all-opus"
    )
    assert code == 0
    assert report["files"][0]["removed"] == 36  # 12 split-K + 24 other gfx950 opus rows


@pytest.mark.parametrize("policy", ["splitk-opus", "all-opus"])
@pytest.mark.parametrize("name", TABLES)
def test_removed_rows_match_the_issue_rule(capsys, tables, name, policy):
    table, rows = tables[name]
    code, report = run_json(capsys, str(table), "--check", "--policy", policy)
    removed = [r["line"] for r in report["files"][0]["removed_rows"]]
    assert removed == oracle_removed(table, policy)
    intended = [r.line for r in rows if (r.unsafe if policy == "splitk-opus"
                                         else r.opus_of_unsafe_arch)]
    assert removed == intended
    assert code == (1 if removed else 0)
    assert report["disagreements"] == 0


def test_split_k_rows_are_found_whatever_their_splitk_column(capsys, tables):
    # 5 of gfx942_model's split-K opus rows say splitK = 0: the kernel picks its split.
    table, rows = tables["gfx942_model_tuned_gemm.csv"]
    zero = [r.line for r in rows if r.unsafe and r.text.split(",")[12] == "0"]
    assert len(zero) == 5
    _, report = run_json(capsys, str(table), "--check")
    assert set(zero) <= {r["line"] for r in report["files"][0]["removed_rows"]}


def test_gfx1250_opus_rows_are_kept_under_both_policies(capsys, tables):
    table, _ = tables["gfx1250_like_tuned_gemm.csv"]
    for policy in ("splitk-opus", "all-opus"):
        _, report = run_json(capsys, str(table), "--check", "--policy", policy)
        gfx1250 = [c for c in report["totals"] if c["arch"] == "gfx1250" and c["libtype"] == "opus"]
        assert gfx1250 == [{"arch": "gfx1250", "libtype": "opus", "kept": 111, "removed": 0}]


# --- byte identity and idempotence ----------------------------------------------------


@pytest.mark.parametrize("policy", ["splitk-opus", "all-opus"])
def test_surviving_bytes_are_identical_and_rerun_removes_nothing(capsys, tmp_path, tables,
                                                                  policy):
    out1, out2 = tmp_path / "once", tmp_path / "twice"
    inputs = paths(tables)
    code, report = run_json(capsys, *map(str, inputs), "-o", str(out1), "--policy", policy)
    assert code == 0 and report["unsafe_rows"] > 0
    for entry in report["files"]:
        source = Path(entry["input"]).read_bytes().splitlines(keepends=True)
        removed = {r["line"] for r in entry["removed_rows"]}
        expected = b"".join(line for n, line in enumerate(source, 1) if n not in removed)
        assert Path(entry["output"]).read_bytes() == expected
    again = [str(out1 / p.name) for p in inputs]
    code, report = run_json(capsys, *again, "-o", str(out2), "--policy", policy)
    assert code == 0 and report["unsafe_rows"] == 0
    for p in inputs:
        assert (out2 / p.name).read_bytes() == (out1 / p.name).read_bytes()
    code, _, _ = run_cli(capsys, *again, "--check", "--policy", policy)
    assert code == 0


def test_line_endings_quoting_and_missing_final_newline_survive(capsys, tmp_path):
    unsafe = row("gfx950", "256", "opus", "204", "opus_gemm_flatmm_splitk_a", m=2)
    lines = [
        HEADER + "\r\n",
        row("gfx950", "256", "asm", "5", "_ZN5aiter3fooE") + "\r\n",
        unsafe + "\n",
        # quoted kernelName holding a comma and an escaped quote: kept
        row("gfx950", "256", "opus", "14", '"opus ""x"", y"', m=3) + "\r\n",
        "\n",  # a blank line is not a row and stays
        # quoted field with an embedded line break, in a removed record
        row("gfx950", "256", '"opus"', "1201", '"opus_gemm\r\nsplitk"', m=4) + "\r\n",
        # quoted libtype with spaces: still opus, in a split-K range
        row("gfx942", "80", '" opus "', "10201", "opus_gemm_gfx942_splitk_p1", m=5) + "\r",
        row("gfx942", "80", "opus", "10300", "opus_gemm_gfx942_flatmm", m=6),  # no newline
    ]
    source = write(tmp_path, "t.csv", "".join(lines).encode())
    code, report = run_json(capsys, str(source), "-o", str(tmp_path / "out"))
    assert code == 0
    assert [r["line"] for r in report["files"][0]["removed_rows"]] == [3, 6, 8]
    expected = "".join(lines[i] for i in (0, 1, 3, 4, 7)).encode()
    assert (tmp_path / "out" / "t.csv").read_bytes() == expected


def test_removing_the_unterminated_last_line_keeps_earlier_bytes(capsys, tmp_path):
    data = f"{HEADER}\n{row('gfx942', '80', 'torch', '0', 'native')}\n" + row(
        "gfx942", "80", "opus", "10200", "opus_gemm_gfx942_splitk_legacy"
    )
    source = write(tmp_path, "t.csv", data.encode())
    assert run_cli(capsys, str(source), "-o", str(tmp_path / "out"))[0] == 0
    assert (tmp_path / "out" / "t.csv").read_bytes() == data.encode().rsplit(b"\n", 1)[0] + b"\n"


def test_utf8_bom_header_is_preserved(capsys, tmp_path):
    data = "\ufeff" + HEADER + "\n" + row("gfx950", "256", "opus", "250", "splitk") + "\n"
    source = write(tmp_path, "t.csv", data.encode())
    code, report = run_json(capsys, str(source), "-o", str(tmp_path / "out"))
    assert code == 0 and report["unsafe_rows"] == 1
    assert (tmp_path / "out" / "t.csv").read_bytes() == ("\ufeff" + HEADER + "\n").encode()


def test_split_records_joins_quoted_line_breaks():
    data = b'a,b\n"x\ny",1\r\n"q""",2'
    assert split_records(data) == [(1, b"a,b\n"), (2, b'"x\ny",1\r\n'), (4, b'"q""",2')]


# --- --check ---------------------------------------------------------------------------


def test_check_writes_nothing_and_lists_unsafe_rows(capsys, tmp_path, tables):
    table, rows = tables["dsv3_like_tuned_gemm.csv"]
    (unsafe,) = [r for r in rows if r.unsafe]
    solidx = unsafe.text.split(",")[11]
    code, out, _ = run_cli(capsys, str(table), "--check", "-o", str(tmp_path / "out"))
    assert code == 1
    assert not (tmp_path / "out").exists()
    assert f"{table}:{unsafe.line}: unsafe: gfx942 cu_num=80 opus solidx={solidx}" in out
    assert "AITER_CONFIG_GEMM_BF16=" not in out


def test_check_exits_0_on_a_table_without_unsafe_rows(capsys, tmp_path):
    data = f"{HEADER}\n{row('gfx942', '80', 'opus', '10300', 'opus_gemm_gfx942_flatmm')}\n"
    source = write(tmp_path, "t.csv", data.encode())
    code, out, _ = run_cli(capsys, str(source), "--check")
    assert code == 0
    assert "would remove 0 of 1 rows" in out
    code, _, _ = run_cli(capsys, str(source), "--check", "--policy", "all-opus")
    assert code == 1


# --- tables without a gfx column --------------------------------------------------------


def drop_gfx(data: bytes) -> bytes:
    return b"".join(line.split(b",", 1)[1] for line in data.splitlines(keepends=True))


def test_table_without_gfx_uses_cu_num(capsys, tmp_path, tables):
    # gfx942 rows (cu_num 80, which only gfx942 lists), with and without the gfx column.
    lines = tables["gfx942_model_tuned_gemm.csv"][0].read_bytes().splitlines(keepends=True)
    gfx942 = b"".join([lines[0], *(line for line in lines[1:] if line.startswith(b"gfx942,"))])
    with_gfx = write(tmp_path, "with.csv", gfx942)
    without_gfx = write(tmp_path, "without.csv", drop_gfx(gfx942))
    _, expected = run_json(capsys, str(with_gfx), "--check")
    code, report = run_json(capsys, str(without_gfx), "--check")
    assert code == 1
    assert report["files"][0]["has_gfx_column"] is False
    assert report["files"][0]["removed_rows"] == expected["files"][0]["removed_rows"]
    assert report["totals"] == expected["totals"]
    assert report["unsafe_rows"] == 22


def test_table_without_gfx_with_arch_option(capsys, tmp_path, tables):
    # The default-like table's gfx950 rows without the gfx column, told apart by --arch.
    lines = tables["bf16_like_tuned_gemm.csv"][0].read_bytes().splitlines(keepends=True)
    gfx950 = b"".join([lines[0], *(line for line in lines[1:] if line.startswith(b"gfx950,"))])
    source = write(tmp_path, "t.csv", drop_gfx(gfx950))
    code, report = run_json(capsys, str(source), "-o", str(tmp_path / "out"), "--arch", "gfx950")
    assert code == 0 and report["unsafe_rows"] == 12
    assert {c["arch"] for c in report["totals"]} == {"gfx950"}
    code, report = run_json(capsys, str(source), "--check", "--arch", "gfx1250")
    assert code == 0 and report["unsafe_rows"] == 0


def test_unknown_cu_num_on_opus_row_needs_arch(capsys, tmp_path):
    data = drop_gfx(f"{HEADER}\n{row('x', '999', 'opus', '10201', 'splitk')}\n".encode())
    source = write(tmp_path, "t.csv", data)
    code, out, err = run_cli(capsys, str(source), "-o", str(tmp_path / "out"))
    assert code == 2 and out == ""
    assert "cu_num '999' names no known architecture" in err and "--arch" in err
    assert not (tmp_path / "out").exists()
    code, report = run_json(capsys, str(source), "--check", "--arch", "gfx942")
    assert code == 1 and report["files"][0]["removed_rows"][0]["arch"] == "gfx942"
    # Read as gfx950, id 10201 is no split-K kernel but the name says split-K: removed anyway.
    code, report = run_json(capsys, str(source), "--check", "--arch", "gfx950:sramecc+:xnack-")
    assert code == 1 and report["arch_override"] == "gfx950" and report["disagreements"] == 1


def test_unknown_cu_num_on_non_opus_row_is_kept_and_labelled(capsys, tmp_path):
    data = drop_gfx(f"{HEADER}\n{row('x', '999', 'triton', '0', 'auto')}\n".encode())
    source = write(tmp_path, "t.csv", data)
    code, report = run_json(capsys, str(source), "-o", str(tmp_path / "out"))
    assert code == 0
    assert report["totals"] == [
        {"arch": "cu_num=999", "libtype": "triton", "kept": 1, "removed": 0}
    ]


def test_ambiguous_cu_num_is_refused_unless_arch_given(tmp_path):
    # 256 is what gfx1250 rows carry in aiter's tables as well as gfx950 ones.
    facts = dict(archs_module.ARCHS)
    facts["gfx1250"] = dataclasses.replace(facts["gfx1250"], cu_nums=(256, 96))
    data = drop_gfx(f"{HEADER}\n{row('x', '256', 'opus', '204', 'splitk')}\n".encode())
    source = write(tmp_path, "t.csv", data)
    with pytest.raises(CaptureSafeError, match=r"used by several architectures \(gfx1250, gfx950"):
        capture_safe([source], None, check=True, archs=facts)
    assert capture_safe([source], None, check=True, arch="gfx950", archs=facts).unsafe_rows == 1
    assert capture_safe([source], None, check=True, arch="gfx1250", archs=facts).unsafe_rows == 0


def test_gfx_column_wins_over_arch_option(capsys, tmp_path):
    data = f"{HEADER}\n{row('gfx950', '256', 'opus', '204', 'splitk')}\n"
    source = write(tmp_path, "t.csv", data.encode())
    code, report = run_json(capsys, str(source), "--check", "--arch", "gfx942")
    assert code == 1 and report["files"][0]["removed_rows"][0]["arch"] == "gfx950"


# --- kernelName vs solidx cross-check -----------------------------------------------------


def test_disagreements_are_reported_and_removed(capsys, tmp_path):
    data = "\n".join(
        [
            HEADER,
            row("gfx950", "256", "opus", "1250", "opus_gemm_flatmm_x", m=1),  # id says split-K
            row("gfx950", "256", "opus", "5000", "opus_gemm_SplitK_new", m=2),  # name says it
            row("gfx950", "256", "opus", "5001", "opus_gemm_flatmm_y", m=3),  # neither
        ]
    )
    source = write(tmp_path, "t.csv", (data + "\n").encode())
    code = main(["gemm-tables", "capture-safe", str(source), "--check", "--json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert code == 1
    assert [r["line"] for r in report["files"][0]["removed_rows"]] == [2, 3]
    assert [r["line"] for r in report["files"][0]["disagreements"]] == [2, 3]
    assert report["disagreements"] == 2
    assert f"{source}:2: kernelName and solidx disagree" in err
    assert f"{source}:3: kernelName and solidx disagree" in err


# --- output and bad input ----------------------------------------------------------------


def test_env_line_names_written_files_in_order(capsys, tmp_path, tables):
    inputs = [tables["gfx942_model_tuned_gemm.csv"][0], tables["bf16_like_tuned_gemm.csv"][0]]
    code, out, _ = run_cli(capsys, *map(str, inputs), "-o", str(tmp_path / "out"))
    assert code == 0
    outs = [str((tmp_path / "out" / t.name).resolve()) for t in inputs]
    assert out.splitlines()[-1] == "AITER_CONFIG_GEMM_BF16=" + ":".join(outs)
    assert "removed 34 of 288 rows in 2 table(s)" in out
    assert re.search(r"gfx942_model_tuned_gemm.csv +gfx942 +opus +9 +22\n", out)


def test_missing_columns_is_refused(capsys, tmp_path, tables):
    out_dir = tmp_path / "out"
    good = tables["bf16_like_tuned_gemm.csv"][0]
    batched = tmp_path / "bf16_tuned_batched_gemm.csv"
    make_batched_table(batched)
    code, out, err = run_cli(capsys, str(good), str(batched), "-o", str(out_dir))
    assert code == 2 and out == ""
    assert "missing column(s) libtype, solidx" in err
    assert not out_dir.exists()  # the good table was not written either


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty file"),
        (f"{HEADER}\n1,2,3\n".encode(), "3 fields but the header has 18 columns"),
        (f'{HEADER}\n"gfx950,256\n'.encode(), "quoted field is never closed"),
        (HEADER.encode() + b"\n\xff\xfe\n", "not UTF-8"),
        (f"{HEADER}\n{row('gfx950', '256', 'opus', 'abc', 'x')}\n".encode(), "'abc' is not an"),
        (f"{HEADER}\n{row('gfx1100', '48', 'opus', '1', 'x')}\n".encode(), "unknown gfx 'gfx1100'"),
    ],
    ids=["empty", "field-count", "open-quote", "not-utf8", "bad-solidx", "unknown-gfx"],
)
def test_malformed_input_exits_2_and_writes_nothing(capsys, tmp_path, data, message):
    source = write(tmp_path, "t.csv", data)
    code, out, err = run_cli(capsys, str(source), "-o", str(tmp_path / "out"))
    assert code == 2 and out == ""
    assert message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("second", ["solidx", " solidx", "splitK", "gfx"])
def test_a_column_the_rules_read_named_twice_is_refused(capsys, tmp_path, second):
    """aiter's pandas reader uses the first column spelt exactly ``solidx`` and renames the
    next ``solidx.1`` (pandas 2.2.3 and 3.1.1, run); with ``" solidx"`` it uses the *other*
    one. Read either way, an unsafe split-K opus row could pass: the table is refused."""
    # solidx 250 is a gfx950 split-K opus kernel; 5 is not (and the name says neither).
    unsafe_first = row("gfx950", "256", "opus", "250", "opus_gemm_512x256")
    last = {"solidx": "5", " solidx": "5", "splitK": "0", "gfx": "gfx950"}[second]
    source = write(tmp_path, "t.csv", f"{HEADER},{second}\n{unsafe_first},{last}\n".encode())
    code, out, err = run_cli(capsys, str(source), "--check", "--aiter", "e4048607")
    assert code == 2 and out == ""
    name = second.strip()
    assert f"t.csv:1: the header names column {name!r} twice" in err
    assert "keep one" in err


def test_a_column_the_rules_do_not_read_may_repeat(capsys, tmp_path):
    safe = row("gfx950", "256", "torch", "0", "native")
    source = write(tmp_path, "t.csv", f"{HEADER},us\n{safe},3.0\n".encode())
    code, _, _ = run_cli(capsys, str(source), "--check")
    assert code == 0


def test_unknown_gfx_on_non_opus_row_is_kept(capsys, tmp_path):
    data = f"{HEADER}\n{row('gfx1100', '48', 'torch', '0', 'native')}\n"
    source = write(tmp_path, "t.csv", data.encode())
    code, report = run_json(capsys, str(source), "--check")
    assert code == 0 and report["totals"][0]["arch"] == "gfx1100"


def test_bad_options_exit_2(capsys, tmp_path, tables):
    table = str(tables["bf16_like_tuned_gemm.csv"][0])
    code, _, err = run_cli(capsys, table, "--check", "--arch", "gfx9000")
    assert code == 2 and "unknown AMD GPU architecture 'gfx9000'" in err
    code, _, err = run_cli(capsys, table)
    assert code == 2 and "-o OUTDIR" in err
    code, _, err = run_cli(capsys, table, "--check", "--policy", "some-opus")
    assert code == 2 and "unknown policy 'some-opus'; choose one of: splitk-opus, all-opus" in err
    code, report = run_json(capsys, table, "--check", "--aiter", "0.1.8")
    assert code == 2 and report == {  # the one --json error envelope (titan_rocm.cli)
        "schema": 1, "command": "gemm-tables", "exit_code": 2,
        "error": "--aiter '0.1.8' is not valid; accepted: 0.1.7, e4048607, main, absent"}
    code, _, err = run_cli(capsys, str(tmp_path / "nope.csv"), "--check")
    assert code == 2 and "cannot read" in err


def test_output_equal_to_input_is_refused(capsys, tmp_path):
    data = f"{HEADER}\n{row('gfx950', '256', 'opus', '204', 'splitk')}\n".encode()
    source = write(tmp_path, "t.csv", data)
    code, _, err = run_cli(capsys, str(source), "-o", str(tmp_path))
    assert code == 2 and "is the input" in err
    link = tmp_path / "link"
    link.symlink_to(tmp_path, target_is_directory=True)
    code, _, err = run_cli(capsys, str(source), "-o", str(link))
    assert code == 2 and "is the input" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "t.csv").symlink_to(source)
    code, _, err = run_cli(capsys, str(source), "-o", str(other))
    assert code == 2 and "is the input" in err
    assert source.read_bytes() == data


def test_same_name_inputs_and_colon_paths_are_refused(capsys, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    data = f"{HEADER}\n".encode()
    one, two = write(tmp_path / "a", "t.csv", data), write(tmp_path / "b", "t.csv", data)
    code, _, err = run_cli(capsys, str(one), str(two), "-o", str(tmp_path / "out"))
    assert code == 2 and "same name" in err
    code, _, err = run_cli(capsys, str(one), "-o", str(tmp_path / "x:y"))
    assert code == 2 and "contains ':'" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "x:y").exists()


def test_existing_output_is_replaced_atomically(capsys, tmp_path, tables):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    table = tables["dsv3_like_tuned_gemm.csv"][0]
    (out_dir / table.name).write_bytes(b"old")
    assert run_cli(capsys, str(table), "-o", str(out_dir))[0] == 0
    assert len((out_dir / table.name).read_bytes()) < len(table.read_bytes())
    assert sorted(p.name for p in out_dir.iterdir()) == [table.name]  # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert (out_dir / table.name).stat().st_mode & 0o777 == 0o666 & ~umask


def test_failed_rename_leaves_destination_and_no_temp_file(tmp_path, monkeypatch):
    dest = tmp_path / "t.csv"
    dest.write_bytes(b"before")

    def fail(*_args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(PartialWrite) as info:
        write_all([(dest, b"after")])
    assert isinstance(info.value.cause, OSError) and info.value.written == []
    assert dest.read_bytes() == b"before"
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]


# --- stopped midway: a full disk, a failed rename, Ctrl-C --------------------------------------


def _fail_on_call(n: int, exc: BaseException, real):
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise exc
        return real(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize(
    ("where", "exc", "code", "said"),
    [
        ("fsync", OSError(28, "No space left on device"), 2, "nothing written"),
        ("fsync", KeyboardInterrupt(), 130, "interrupted; nothing written"),
        ("replace", OSError(13, "Permission denied"), 2, "written 1 of 3 table(s): "),
        ("replace", KeyboardInterrupt(), 130, "interrupted; written 1 of 3 table(s): "),
        ("read", KeyboardInterrupt(), 130, "interrupted; nothing written"),
    ],
    ids=["disk-full-while-writing", "ctrl-c-while-writing", "rename-fails",
         "ctrl-c-among-renames", "ctrl-c-while-reading"],
)
def test_stopping_midway_says_which_tables_were_written(
    capsys, tmp_path, tables, monkeypatch, where, exc, code, said
):
    # The package exports a function named capture_safe: take the module itself.
    module = sys.modules["titan_rocm.gemm_tables.capture_safe"]

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    inputs = paths(tables)[:3]
    for t in inputs:
        (out_dir / t.name).write_bytes(b"old")
    real = {"fsync": os.fsync, "replace": os.replace, "read": module.read_table}[where]
    target = module if where == "read" else os
    name = "read_table" if where == "read" else where
    monkeypatch.setattr(target, name, _fail_on_call(2, exc, real))
    got, out, err = run_cli(capsys, *map(str, inputs), "-o", str(out_dir))
    assert got == code and out == ""
    (line,) = err.strip().splitlines()
    assert said in line
    written = [t for t in inputs if (out_dir / t.name).read_bytes() != b"old"]
    if "nothing written" in said:
        assert written == []
    else:
        assert written == inputs[:1]
        assert line.endswith("not written: " + ", ".join(
            str((out_dir / t.name).resolve()) for t in inputs[1:]))
        assert str((out_dir / inputs[0].name).resolve()) in line
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(t.name for t in inputs)  # no temp


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_table_error_names_the_file_and_line(tmp_path, data):
    source = bytearray(f"{HEADER}\n{row('gfx950', '256', 'opus', '204', 'splitk')}\n"
                       f"{row('gfx942', '80', 'asm', '3', 'k', m=2)}\n".encode())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(source) - 1))
        op = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if op == "set":
            source[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            source.insert(pos, data.draw(st.sampled_from(list(b',"\n\r\x00x\xff'))))
        elif len(source) > 1:
            del source[pos]
    table = tmp_path / "t.csv"
    table.write_bytes(bytes(source))
    try:
        capture_safe([table], None, check=True)
    except CaptureSafeError as exc:
        assert re.match(rf"{re.escape(str(table))}(:\d+)?: ", str(exc)), str(exc)


def test_a_fifo_as_table_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "t.csv"
    os.mkfifo(fifo)
    out = subprocess.run([sys.executable, "-m", "titan_rocm.cli", "gemm-tables", "capture-safe",
                          str(fifo), "--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "is a named pipe (FIFO), not a regular file" in out.stderr


def test_module_does_not_import_torch():
    code = (
        "import sys, titan_rocm.cli.gemm_tables, titan_rocm.gemm_tables; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- aiter's tables: the counts docs/gemm-tables.md gives, on tables of that composition ------


def by_arch(report: dict) -> dict[str, tuple[int, int]]:
    totals: dict[str, list[int]] = {}
    for c in report["totals"]:
        entry = totals.setdefault(c["arch"], [0, 0])
        entry[0] += c["kept"]
        entry[1] += c["removed"]
    return {arch: (kept, removed) for arch, (kept, removed) in totals.items()}


def aiter_like_tables(tmp_path: Path) -> list[str]:
    """Three tables holding, together, the rows of aiter's 17 (AITER_COMPOSITION)."""
    inputs = []
    for i, composition in enumerate(split_composition(AITER_COMPOSITION, 3)):
        path = tmp_path / f"aiter_like_{i}_bf16_tuned_gemm.csv"
        make_table(path, composition, seed=100 + i,
                   splitk_zero={a: n // 3 for a, n in AITER_SPLITK_ZERO.items()})
        inputs.append(str(path))
    return inputs


def by_rule(report: dict) -> dict[str, int]:
    return {r["name"]: r["removed"] for r in report["rules"]}


def test_counts_on_tables_composed_like_aiters(capsys, tmp_path):
    inputs = aiter_like_tables(tmp_path)
    code, report = run_json(capsys, *inputs, "-o", str(tmp_path / "out"),
                            "--aiter", "e4048607")
    assert code == 0
    assert (report["rows"], report["unsafe_rows"], report["disagreements"]) == (3338, 928, 0)
    assert by_rule(report) == {"asm-splitk-semaphore": 216, "opus-splitk-workspace": 106,
                               "flydsl-splitk-counter": 606}
    assert by_arch(report) == {"gfx942": (127, 95), "gfx950": (1369, 833), "gfx1250": (914, 0)}
    code, report = run_json(capsys, *inputs, "--check", "--policy", "all-opus",
                            "--aiter", "e4048607")
    assert code == 1
    assert report["unsafe_rows"] == 1081
    assert by_rule(report)["opus-splitk-workspace"] == 259
    assert by_arch(report) == {"gfx942": (23, 199), "gfx950": (1320, 882), "gfx1250": (914, 0)}
    # aiter main has #4916 and #4961: only the FlyDSL rows go (the docs' per-rule line).
    code, report = run_json(capsys, *inputs, "--check", "--aiter", "main")
    assert (code, report["unsafe_rows"]) == (1, 606)
    assert {r["name"]: r["kept_as_fixed"] for r in report["rules"]} == {
        "asm-splitk-semaphore": 216, "opus-splitk-workspace": 106, "flydsl-splitk-counter": 0}
    # aiter 0.1.7 has none of the three hazards: nothing removed, each rule's rows counted.
    code, report = run_json(capsys, *inputs, "--check", "--aiter", "0.1.7")
    assert (code, report["unsafe_rows"]) == (0, 0)
    assert {r["name"]: r["kept_as_fixed"] for r in report["rules"]} == {
        "asm-splitk-semaphore": 216, "opus-splitk-workspace": 106, "flydsl-splitk-counter": 606}


def test_csv_module_reads_our_oracle_the_same_way(tables):
    # Guard for oracle_removed: the tables have no quotes, so a plain DictReader and
    # line numbering agree with the package's record numbering.
    for table in paths(tables):
        assert b'"' not in table.read_bytes()
        rows = list(csv.reader(io.StringIO(table.read_text(), newline="")))
        assert len(rows) == len(table.read_bytes().splitlines())


@pytest.mark.parametrize(
    ("arch", "inside", "outside"),
    [
        ("gfx950", [200, 299, 1200, 1299], [0, 199, 300, 1199, 1300, 10200]),
        ("gfx942", [10200, 10299], [200, 1200, 10199, 10300]),
        ("gfx1250", [], [200, 1200, 10200, 20000, 20999]),
    ],
)
def test_split_k_range_boundaries(arch, inside, outside):
    facts = archs_module.ARCHS[arch]
    assert [in_splitk_range(i, facts) for i in inside] == [True] * len(inside)
    assert [in_splitk_range(i, facts) for i in outside] == [False] * len(outside)


def test_cu_num_the_arch_does_not_list_is_noted(capsys, tmp_path):
    data = drop_gfx(f"{HEADER}\n{row('x', '80', 'opus', '204', 'splitk')}\n".encode())
    source = write(tmp_path, "t.csv", data)
    code = main(["gemm-tables", "capture-safe", str(source), "--check", "--arch", "gfx950"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "note: 1 gfx950 row(s) carry cu_num 80, which titan_rocm.archs does not list" in err
    _, report = run_json(capsys, str(source), "--check", "--arch", "gfx942")
    assert report["cu_nums_not_in_archs"] == []


def test_unwritable_output_dir_exits_2(capsys, tmp_path, tables):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    table = str(tables["dsv3_like_tuned_gemm.csv"][0])
    code, _, err = run_cli(capsys, table, "-o", str(blocker))
    assert code == 2 and "is not a directory" in err
    code, _, err = run_cli(capsys, table, "-o", str(blocker / "sub"))
    assert code == 2 and "cannot write to" in err and "nothing written" in err


def test_the_text_report_is_one_aligned_table_per_run(capsys, tables):
    """The counts table (tabulate, issue 25 item 8): a header, one row per file x arch x
    libtype plus the totals of several files, every count right-aligned under its header."""
    paths = [str(tables[name][0]) for name in ("bf16_like_tuned_gemm.csv",
                                               "dsv3_like_tuned_gemm.csv")]
    code, out, _ = run_cli(capsys, *paths, "--check")
    assert code in (0, 1)
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:5] == [
        "file", "arch", "libtype", "kept", "removed"])
    table = [line for line in lines[start:] if line.strip()]
    header, rows = table[0], table[1:]
    assert rows and any(line.startswith("(all files)") for line in rows)
    for column in ("kept", "removed"):
        end = header.index(column) + len(column)
        body = [line for line in rows if len(line.split()) == 5]
        assert body and all(line[:end].rstrip() == line[:end] and line[end - 1].isdigit()
                            for line in body), (column, table)
