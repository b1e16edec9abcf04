"""``titan-rocm scan``: output, exit codes 0/1/2, odd input never crashes it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titan_rocm.cli import main

CORPUS = Path(__file__).parent / "corpus" / "amdgcn"
STORE = "buffer_store_dwordx4 v[0:3], v36, s[8:11], 0 offen"


def hazardous_text(soffset: str = "s12", between: str = "") -> str:
    """The real gfx942 SwiGLU backward with its first store made hazardous."""
    text = (CORPUS / "swiglu_bwd-gfx942-buf.amdgcn").read_text()
    new = STORE.replace(" 0 offen", f" {soffset} offen") + between
    return text.replace(STORE, new + "\n\tv_pk_mul_f32 v[0:1], v[18:19], v[14:15]")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A Triton-cache-like tree: one clean kernel, one hazardous, plus other files."""
    clean = tmp_path / "AAAA"
    clean.mkdir()
    shutil.copy(CORPUS / "softmax_fwd-gfx942-buf.amdgcn", clean / "softmax_fwd.amdgcn")
    (clean / "softmax_fwd.hsaco").write_bytes(b"\x7fELF\x00junk")
    (clean / "softmax_fwd.json").write_text("{}")
    bad = tmp_path / "BBBB" / "deeper"
    bad.mkdir(parents=True)
    (bad / "swiglu_bwd.amdgcn").write_text(hazardous_text())
    return tmp_path


def test_clean_corpus_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(CORPUS)]) == 0
    out = capsys.readouterr().out
    assert "scanned 44 file(s), 34 buffer store(s)" in out
    assert "0 hazardous store(s)" in out


def test_hazard_exits_1_with_one_line_per_store(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scan", str(cache)]) == 1
    out = capsys.readouterr().out.splitlines()
    hazard_lines = [line for line in out if "overwritten by" in line]
    assert len(hazard_lines) == 1
    line = hazard_lines[0]
    assert "swiglu_bwd.amdgcn:442: swiglu_bwd:" in line
    assert "buffer_store_dwordx4 v[0:3], v36, s[8:11], s12 offen" in line
    assert "v_pk_mul_f32 v[0:1], v[18:19], v[14:15]" in line
    assert "after 0 wait state(s), needs 1" in line
    assert "scanned 2 file(s)" in out[-1] and "1 hazardous store(s) in 1 kernel(s)" in out[-1]


def test_json_output(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(cache), "--json"]) == 1
    hazards = json.loads(capsys.readouterr().out)
    assert len(hazards) == 1
    h = hazards[0]
    assert {"file", "line", "store", "writer", "wait_states", "required"} <= set(h)
    assert h["file"].endswith("swiglu_bwd.amdgcn") and h["line"] == 442
    assert (h["wait_states"], h["required"], h["kernel"]) == (0, 1, "swiglu_bwd")


def test_json_clean_is_an_empty_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(CORPUS / "matmul-gfx950-buf.amdgcn"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_unprotected_global_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (CORPUS / "swiglu_bwd-gfx942-nobuf.amdgcn").read_text()
    store = next(line.strip() for line in text.splitlines() if "global_store_dwordx4" in line)
    data = store.split(",")[1].strip()  # global stores: address first, data second
    first = data.replace("[", "").split(":")[0]  # v[4:7] -> v4
    f = tmp_path / "k.amdgcn"
    f.write_text(text.replace(store, f"{store}\n\tv_mov_b32 {first}, 0", 1))
    assert main(["scan", str(f)]) == 1
    out = capsys.readouterr().out
    assert "a global store: recompiling with buffer ops off cannot fix it" in out
    assert "0 hazardous store(s)" in out and "1 of them overwritten too soon" in out
    assert main(["scan", str(f), "--json"]) == 1
    (entry,) = json.loads(capsys.readouterr().out)
    assert (entry["kind"], entry["recompile_fixes"], entry["wait_states"]) == ("global", False, 0)


def test_rule_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "k.amdgcn"
    f.write_text(hazardous_text(between="\n\ts_nop 0"))  # 1 wait state, SGPR soffset
    assert main(["scan", str(f)]) == 0
    assert main(["scan", str(f), "--rule", "conservative"]) == 1
    assert "needs 2" in capsys.readouterr().out
    assert main(["scan", str(f), "--rule", "naive"]) == 2  # not offered to users


def test_arch_option(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(cache), "--arch", "gfx90a"]) == 0
    assert "gfx90a does not have the buffer-store data hazard" in capsys.readouterr().err
    assert main(["scan", str(cache), "--arch", "gfx1100"]) == 1
    assert "unknown to titan-rocm" in capsys.readouterr().err


def test_missing_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "no such file or directory" in err and "nope" in err


def test_directory_without_amdgcn_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "k.hsaco").write_bytes(b"\x7fELF")
    assert main(["scan", str(tmp_path)]) == 2
    assert "no .amdgcn files" in capsys.readouterr().err


def test_missing_path_beside_good_one(cache: Path) -> None:
    clean = str(cache / "AAAA")
    assert main(["scan", clean]) == 0
    assert main(["scan", clean, str(cache / "nope")]) == 2
    assert main(["scan", str(cache), str(cache / "nope")]) == 1  # a hazard outranks it


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00" * 100, os.urandom(4096), b"\xff\xfe\x00garbage\n\x80", b"not assembly at all"],
)
def test_junk_files(tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "junk.amdgcn"
    f.write_bytes(content)
    code = main(["scan", str(f)])
    # Text that happens to read like an instruction is scanned (clean); anything else
    # holds no AMDGCN.
    assert code in (0, 2)
    if code == 2:
        assert "no AMDGCN" in capsys.readouterr().err


def test_junk_beside_good_files_is_skipped(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cache / "AAAA" / "empty.amdgcn").write_bytes(b"")
    assert main(["scan", str(cache / "AAAA")]) == 0
    assert "empty.amdgcn: no AMDGCN instructions" in capsys.readouterr().err


def test_truncated_files(tmp_path: Path) -> None:
    text = hazardous_text()
    for cut in (10, len(text) // 3, text.index(STORE.split(",")[0]) + 30, len(text) - 5):
        f = tmp_path / f"cut{cut}.amdgcn"
        f.write_text(text[:cut])
        assert main(["scan", str(f)]) in (0, 1, 2)
    f = tmp_path / "after_writer.amdgcn"
    f.write_text(text[: text.index("v_pk_mul_f32 v[0:1], v[18:19], v[14:15]") + 45])
    assert main(["scan", str(f)]) == 1


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=2048))
def test_cli_never_crashes(tmp_path: Path, data: bytes) -> None:
    f = tmp_path / "fuzz.amdgcn"
    f.write_bytes(data)
    assert main(["scan", str(f), "--json"]) in (0, 1, 2)


def test_console_script_runs_without_torch(cache: Path) -> None:
    """``python -m titan_rocm.cli scan`` works and never imports torch or triton."""
    code = (
        "import sys; from titan_rocm.cli import main; rc = main(['scan', sys.argv[1]]); "
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'heavy import'; "
        "sys.exit(rc)"
    )
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "overwritten by" in proc.stdout
