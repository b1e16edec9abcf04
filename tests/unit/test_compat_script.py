"""scripts/compat.sh (docs/compatibility.md): its refusals, and a re-run on kept venvs (a fake
venv whose ``bin/python`` answers the script's version question and prints a pytest summary,
so no pip and no suite runs here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "compat.sh"

FAKE_PYTHON = """#!/usr/bin/env bash
# The script asks "torch torchtitan" on stdin ("-"), then runs "-m pytest ...".
if [[ "$1" == "-" ]]; then cat >/dev/null; echo "9.9.9 {tt}"; exit 0; fi
printf '%s\\n' "$@" > "{venv}/pytest-args"
echo "..F.s"
echo "==== 3 passed, 1 failed, 2 skipped in 1.23s ===="
exit {rc}
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COMPAT_DIR"}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=60, cwd=REPO)


def _fake_venv(root: Path, tt: str, rc: int = 1) -> Path:
    venv = root / f"torch-9.9.9-tt{tt}"
    (venv / "bin").mkdir(parents=True)
    (venv / "titan-rocm-compat").write_text("torch=9.9.9 torchtitan=" + tt + "\n")
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON.format(tt=tt, venv=venv, rc=rc))
    python.chmod(0o755)
    return venv


@pytest.mark.parametrize("args,sentence", [
    ((), "no torch version given; usage: scripts/compat.sh TORCH_VERSION"),
    (("2.15",), "torch version 2.15 is not a release number; accepted: X.Y.Z"),
    (("2.15.0", "0.4.0"), "TorchTitan 0.4.0 is not one this script runs; accepted: 0.2.2, "
     "0.3.0, both"),
    (("2.15.0", "--reuse-all"), "unknown option --reuse-all; accepted: --reuse"),
    (("2.15.0", "--dir"), "--dir needs a value"),
    (("2.15.0", "--torch-from", "/nonexistent"), "--torch-from /nonexistent is not a venv"),
    (("2.15.0", "--python", "no-such-python3"), "no Python interpreter no-such-python3"),
])
def test_bad_input_exits_2_with_one_sentence(tmp_path: Path, args: tuple[str, ...],
                                             sentence: str) -> None:
    done = _run("--dir", str(tmp_path / "venvs"), *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("compat: ") and sentence in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "venvs").exists()


def test_a_directory_it_did_not_make_is_left_alone(tmp_path: Path) -> None:
    venv = tmp_path / "torch-2.15.0-tt0.2.2"
    venv.mkdir()
    (venv / "keep").write_text("mine")
    done = _run("2.15.0", "0.2.2", "--dir", str(tmp_path))
    assert done.returncode == 2
    assert "exists and was not made by this script: remove it or choose another --dir" \
        in done.stderr
    assert (venv / "keep").read_text() == "mine"


def test_reuse_runs_each_suite_in_its_kept_venv_and_prints_one_line_each(
        tmp_path: Path) -> None:
    old, new = _fake_venv(tmp_path, "0.2.2"), _fake_venv(tmp_path, "0.3.0", rc=0)
    done = _run("9.9.9", "--reuse", "--dir", str(tmp_path), "--", "tests/unit", "-x")
    assert done.returncode == 1, done.stderr  # one suite failed
    assert done.stdout.strip().splitlines()[-2:] == [
        f"compat: torch 9.9.9 + TorchTitan {tt}: 3 passed, 1 failed, 2 skipped "
        f"(log: {venv / 'pytest.log'})" for tt, venv in (("0.2.2", old), ("0.3.0", new))]
    assert f"compat: reusing {old}" in done.stdout and "installing" not in done.stdout
    assert (old / "pytest-args").read_text().split() == ["-m", "pytest", "-q", "-m",
                                                         "torchtitan022", "tests/unit", "-x"]
    assert (new / "pytest-args").read_text().split() == ["-m", "pytest", "-q", "-m",
                                                         "torchtitan030", "tests/unit", "-x"]
    assert "3 passed, 1 failed" in (old / "pytest.log").read_text()


def test_one_suite_that_passes_exits_0(tmp_path: Path) -> None:
    _fake_venv(tmp_path, "0.3.0", rc=0)
    done = _run("9.9.9", "0.3.0", "--reuse", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith(
        "compat: torch 9.9.9 + TorchTitan 0.3.0: 3 passed")


FAKE_INTERPRETER = """#!/usr/bin/env bash
# "-m venv DIR" makes a venv whose python refuses torch as pip does under a constraints file.
[[ "$1 $2" == "-m venv" ]] || exit 9
mkdir -p "$3/bin"
cat > "$3/bin/python" <<'PY'
#!/usr/bin/env bash
# pip's ERROR line is CRITICAL, its reason INFO: -q keeps the first only.
echo "ERROR: Cannot install torch==9.9.9 because of conflicting dependencies." >&2
[[ " $* " == *" -q "* ]] || echo "    The user requested (constraint) torch<=2.14.1"
exit 1
PY
chmod +x "$3/bin/python"
"""


def test_a_refused_install_shows_pips_own_reason(tmp_path: Path) -> None:
    interpreter = tmp_path / "fake-python"
    interpreter.write_text(FAKE_INTERPRETER)
    interpreter.chmod(0o755)
    done = _run("9.9.9", "0.2.2", "--dir", str(tmp_path / "venvs"), "--python", str(interpreter))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "The user requested (constraint) torch<=2.14.1" in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "compat: pip could not install torch==9.9.9"), done.stderr
