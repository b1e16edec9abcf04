"""scripts/docstring_lines.py counts the lines of string statements (issue 39, item 6)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "docstring_lines.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("docstring_lines", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = '''"""Module docstring,
on two lines."""

X = 1
"""Attribute docstring."""

NOT_A_STATEMENT = """an assigned string
is code, not a docstring"""


class A:
    """Class docstring.

    With a blank line inside, which is not counted.
    """

    def f(self) -> str:
        "one line"
        return f"{X}"
'''


def test_counts_string_statements_not_assigned_strings(script, tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    non_blank = sum(1 for line in SOURCE.splitlines() if line.strip())
    # module 2 + attribute 1 + class 3 (its blank line left out) + method 1
    assert script.count(path) == (non_blank, 7)


def test_prints_totals_and_selection(script, tmp_path: Path, capsys) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text(SOURCE)
    (package / "b.py").write_text("x = 1\n")
    assert script.main([str(package), "--top", "-1", "--files", str(package / "a.py")]) == 0
    out = capsys.readouterr().out
    assert "selected: 7 docstring lines of 13 non-blank lines in 1 files" in out
    assert "total: 7 docstring lines of 14 non-blank lines in 2 files" in out


def test_refuses_a_path_that_is_not_a_folder(script, tmp_path: Path, capsys) -> None:
    assert script.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "is not a folder" in err and "missing" in err
