"""``titan-rocm scan``: output, exit codes 0/1/2, odd input never crashes it."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titan_rocm.cli import main
from titan_rocm.scanner.scan import not_amdgcn

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "amdgcn"
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
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == 1 and report["files_scanned"] == 2
    hazards = report["hazards"]
    assert len(hazards) == 1
    h = hazards[0]
    assert {"file", "line", "store", "writer", "wait_states", "required"} <= set(h)
    assert h["file"].endswith("swiglu_bwd.amdgcn") and h["line"] == 442
    assert (h["wait_states"], h["required"], h["kernel"]) == (0, 1, "swiglu_bwd")


def test_json_clean_is_an_empty_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(CORPUS / "matmul-gfx950-buf.amdgcn"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["exit_code"], report["hazards"], report["files_scanned"]) == (0, [], 1)


def test_json_of_bad_input_is_an_error_never_a_clean_list(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "--json", "/nope"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == 2 and report["files_scanned"] == 0
    assert any("/nope" in m for m in report["messages"])


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
    (entry,) = json.loads(capsys.readouterr().out)["hazards"]
    assert (entry["kind"], entry["recompile_fixes"], entry["wait_states"]) == ("global", False, 0)


def test_rule_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "k.amdgcn"
    f.write_text(hazardous_text(between="\n\ts_nop 0"))  # 1 wait state, SGPR soffset
    assert main(["scan", str(f)]) == 0
    assert main(["scan", str(f), "--rule", "conservative"]) == 1
    assert "needs 2" in capsys.readouterr().out
    assert main(["scan", str(f), "--rule", "naive"]) == 2  # not offered to users


def test_arch_option(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(cache), "--arch", "gfx90a"]) == 1  # no arch is exempt
    assert "no hazard-window facts for gfx90a" in capsys.readouterr().err
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


NOT_AMDGCN = {
    "empty": b"",
    "nul-bytes": b"\x00" * 100,
    "random-bytes": bytes(random.Random(3).randrange(256) for _ in range(4096)),
    "elf-hsaco": b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 8,
    "utf16-junk": b"\xff\xfe\x00garbage\n\x80",
    "prose": b"not assembly at all\nv_add is an instruction name in this README\n",
    "passwd": b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n",
    "c-source": b"int v_count = 0;\ns_total += v_count;\nreturn s_total;\n",
    "target-only": b'\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942"\n\t.text\n',
    "x86-assembly": b"\t.text\nmain:\n\tpushq %rbp\n\tmovq %rsp, %rbp\n\tret\n" * 20,
}


@pytest.mark.parametrize("content", NOT_AMDGCN.values(), ids=NOT_AMDGCN.keys())
def test_files_that_are_not_amdgcn_are_never_a_pass(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "k.amdgcn"
    f.write_bytes(content)
    assert not_amdgcn(content) is not None
    assert main(["scan", str(f)]) == 2  # named on the command line and not AMDGCN
    out, err = capsys.readouterr()
    assert "scanned 1 file" not in out
    assert f"{f}: not scanned: not AMDGCN (" in err and "no AMDGCN found" in err
    # Found in a directory beside real kernels: named, skipped, not counted as scanned.
    shutil.copy(CORPUS / "softmax_fwd-gfx942-buf.amdgcn", tmp_path / "good.amdgcn")
    assert main(["scan", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "scanned 1 file(s)" in out and "1 not scanned" in out
    assert f"{f}: not scanned: not AMDGCN (" in err


def test_real_amdgcn_is_recognised_with_or_without_directives() -> None:
    for path in sorted(CORPUS.glob("*.amdgcn")):
        text = path.read_text()
        assert not_amdgcn(text) is None, path.name
        # A bare listing (instructions only, as pasted from a disassembly) counts too.
        bare = "\n".join(line for line in text.splitlines()
                         if line.strip()[:2] in ("s_", "v_") or "buffer_" in line)
        assert not_amdgcn(bare) is None, path.name
        # ... but a handful of them in other text does not.
        few = "\n".join(["some notes"] * 20 + bare.splitlines()[:3])
        assert not_amdgcn(few) is not None, path.name


def test_junk_beside_good_files_is_skipped(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cache / "AAAA" / "empty.amdgcn").write_bytes(b"")
    assert main(["scan", str(cache / "AAAA")]) == 0
    assert "empty.amdgcn: not scanned: not AMDGCN (empty)" in capsys.readouterr().err


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
    code = main(["scan", str(f), "--json"])
    assert code in (0, 1, 2)
    assert code == 2 or not_amdgcn(data) is None  # no pass without recognised AMDGCN


def test_console_script_runs_without_torch(cache: Path) -> None:
    """``python -m titan_rocm.cli scan`` works and never imports torch or triton."""
    code = (
        "import sys; from titan_rocm.cli import main; rc = main(['scan', sys.argv[1]]); "
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'heavy import'; "
        "sys.exit(rc)"
    )
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "overwritten by" in proc.stdout


# --- trees: links, loops, duplicates, special files ------------------------------------------


def test_directory_symlinks_are_followed_once_each(
    cache: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "swiglu_bwd.amdgcn").write_text(hazardous_text())
    (cache / "AAAA" / "linked").symlink_to(outside, target_is_directory=True)
    (cache / "AAAA" / "loop").symlink_to(cache, target_is_directory=True)  # back to the top
    assert main(["scan", str(cache / "AAAA")]) == 1  # the hazard behind the link is found
    out, err = capsys.readouterr()
    assert "linked/swiglu_bwd.amdgcn:442:" in out
    # The whole tree through the loop, once each: 3 kernels, the loop not followed again.
    assert main(["scan", str(cache)]) == 1
    out, err = capsys.readouterr()
    assert "scanned 3 file(s)" in out
    assert "a symlink to a directory already scanned" in err


def test_the_same_file_given_or_reached_twice_is_scanned_once(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel = cache / "BBBB" / "deeper" / "swiglu_bwd.amdgcn"
    (cache / "AAAA" / "alias.amdgcn").symlink_to(kernel)
    os.link(kernel, cache / "AAAA" / "hardlink.amdgcn")
    assert main(["scan", str(kernel), str(kernel), str(cache)]) == 1
    out, err = capsys.readouterr()
    assert sum("overwritten by" in line for line in out.splitlines()) == 1
    assert "scanned 2 file(s)" in out and "scanned once" in err


def test_a_dangling_link_is_reported_and_the_rest_scanned(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cache / "AAAA" / "gone.amdgcn").symlink_to(cache / "nowhere.amdgcn")
    assert main(["scan", str(cache / "AAAA")]) == 0
    out, err = capsys.readouterr()
    assert "gone.amdgcn: a dangling symlink to" in err and "scanned 1 file(s)" in out
    assert "1 not scanned" in out
    assert main(["scan", str(cache / "AAAA" / "gone.amdgcn")]) == 2  # given itself
    assert "dangling symlink" in capsys.readouterr().err


def test_fifos_are_refused_without_blocking(cache: Path) -> None:
    os.mkfifo(cache / "AAAA" / "pipe.amdgcn")
    os.mkfifo(cache / "given.amdgcn")
    code = "import sys; from titan_rocm.cli import main; sys.exit(main(['scan', *sys.argv[1:]]))"
    tree = subprocess.run([sys.executable, "-c", code, str(cache / "AAAA")],
                          capture_output=True, text=True, timeout=60)
    assert tree.returncode == 0
    assert "pipe.amdgcn: a named pipe (FIFO), not a regular file: skipped" in tree.stderr
    given = subprocess.run([sys.executable, "-c", code, str(cache / "given.amdgcn")],
                           capture_output=True, text=True, timeout=60)
    assert given.returncode == 2 and "FIFO" in given.stderr
