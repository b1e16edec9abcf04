"""The capture rules of ``titan-rocm gemm-tables`` (titan_rocm.gemm_tables.rules): which rows
each removes, which hold for an aiter (its sources, or ``--aiter``), and their counts."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tests.support.gemm_table_maker import HEADER, make_table  # tests/ is on sys.path
from titan_rocm.cli import main
from titan_rocm.gemm_tables import rules as rules_module
from titan_rocm.gemm_tables.capture_safe import capture_safe
from titan_rocm.gemm_tables.rules import RULE_NAMES, RULES, detect, simulated
from titan_rocm.platform import AITER_CHOICES, SIMULATED_AITERS

# One row of each kind a rule decides about, and what removes it when every rule holds.
KINDS = {
    ("gfx950", "asm", "splitk"): "asm-splitk-semaphore",
    ("gfx942", "asm", "splitk"): "asm-splitk-semaphore",
    ("gfx950", "asm", "-"): None,  # splitK 0 or 1: no semaphore
    ("gfx950", "opus", "splitk"): "opus-splitk-workspace",
    ("gfx942", "opus", "splitk"): "opus-splitk-workspace",
    ("gfx950", "opus", "other"): None,
    ("gfx950", "flydsl", "small_m"): "flydsl-splitk-counter",
    ("gfx950", "flydsl", "splitk"): "flydsl-splitk-counter",  # hgemm
    ("gfx950", "flydsl", "-"): None,  # split_k 1 (no counter) or a name aiter does not parse
    ("gfx1250", "opus", "safe-arch"): None,
}

# What each rule's fix adds to aiter's Python sources, and the code it is found beside: a
# fake aiter tree holds the defect's code, and the fix's where the test says so.
FAKE_FILES = {
    "asm-splitk-semaphore": ("ops/gemm_op_a16w16.py",
                             "def get_semaphore_workspace(device):\n    ...\n",
                             "    if torch.cuda.is_current_stream_capturing():\n        ...\n"),
    "opus-splitk-workspace": ("ops/opus/gemm_op_a16w16.py",
                              "def opus_gemm_workspace_init() -> None: ...\n",
                              None),
    "flydsl-splitk-counter": ("ops/flydsl/gemm_kernels.py",
                              "def _get_split_k_tensors(device, stream):\n    ...\n",
                              "def _get_split_k_tensors_cached(device, stream):\n    ...\n"),
}
OPUS_FIX = ("ops/opus/gemm/gemm_op_a16w16.py",
            '@compile_ops("module_deepgemm_opus", fc_name="opus_gemm_a16w16_launch")\n')


def fake_aiter(root: Path, fixed: set[str], *, hazards: bool = True) -> Path:
    """An aiter package tree under ``root`` with the fixes of the ``fixed`` rules."""
    package = root / "aiter"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, (path, hazard, fix) in FAKE_FILES.items():
        text = (hazard if hazards else "") + (fix or "" if name in fixed else "")
        target = package / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("import torch\n" + text)
    if "opus-splitk-workspace" in fixed:
        target = package / OPUS_FIX[0]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(OPUS_FIX[1])
    return package


@pytest.fixture()
def kinds_table(tmp_path: Path):
    path = tmp_path / "kinds_bf16_tuned_gemm.csv"
    rows = make_table(path, {kind: 1 for kind in KINDS}, seed=7)
    return path, rows


def removed_lines(result) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for file_result in result.files:
        for note in file_result.removed.kept:
            out.setdefault(note.rule, []).append(note.line)
    return out


def expected_lines(rows, holding: set[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for row in rows:
        rule = KINDS[(row.arch, row.libtype, row.kind)]
        if rule in holding:
            out.setdefault(rule, []).append(row.line)
    return out


def test_rules_are_named_cited_and_end_with_an_aiter_change():
    assert RULE_NAMES == ("asm-splitk-semaphore", "opus-splitk-workspace",
                          "flydsl-splitk-counter")
    for rule in RULES:
        assert "ROCm/aiter#" in rule.ended_by and "aiter/" in rule.source
        assert rule.fix.text and rule.hazard.text
        assert set(rule.to_dict()) >= {"name", "source", "ended_by", "fix_marker"}


@pytest.mark.parametrize("fixed_rule", [None, *RULE_NAMES])
def test_each_rule_removes_its_rows_unless_the_installed_aiter_has_its_fix(
        tmp_path, kinds_table, fixed_rule):
    path, rows = kinds_table
    fixed = set() if fixed_rule is None else {fixed_rule}
    state = detect(fake_aiter(tmp_path / "site", fixed))
    holding = set(RULE_NAMES) - fixed
    assert {s.rule.name for s in state.states if s.holds} == holding
    for s in state.states:
        assert ("fixed here" in s.why) == (s.rule.name in fixed)
    result = capture_safe([path], None, check=True, rules=state)
    assert removed_lines(result) == expected_lines(rows, holding)
    kept = {r["name"]: r["kept_as_fixed"] for r in result.rule_counts()}
    assert kept == {name: 2 * (name in fixed) for name in RULE_NAMES}


def test_an_aiter_without_the_defects_code_or_the_fix_gets_every_rule(tmp_path):
    state = detect(fake_aiter(tmp_path / "site", set(), hazards=False))
    assert all(s.holds for s in state.states)
    assert all("applied, to be safe" in s.why for s in state.states)


def test_the_installed_aiter_is_found_without_importing_it(capsys, tmp_path, kinds_table,
                                                          monkeypatch):
    path, rows = kinds_table
    site = tmp_path / "site"
    fake_aiter(site, {"asm-splitk-semaphore"})
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    code = main(["gemm-tables", "capture-safe", str(path), "--check", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert "aiter" not in sys.modules  # found by its spec; its torch import never ran
    assert code == 1 and report["aiter"] == f"installed at {site / 'aiter'}"
    holds = {r["name"]: r["holds"] for r in report["rules"]}
    assert holds == {"asm-splitk-semaphore": False, "opus-splitk-workspace": True,
                     "flydsl-splitk-counter": True}
    assert report["unsafe_rows"] == 4  # 2 opus split-K + 2 FlyDSL split-K; the 2 asm kept


def test_no_aiter_known_applies_every_rule_and_says_so(capsys, kinds_table, monkeypatch):
    path, rows = kinds_table
    monkeypatch.setattr(rules_module, "installed_aiter_root", lambda: None)
    code = main(["gemm-tables", "capture-safe", str(path), "--check"])
    out = capsys.readouterr().out
    assert code == 1
    assert "aiter: unknown" in out
    for name in RULE_NAMES:
        assert f"rule {name}: holds" in out
    assert out.count("no aiter is installed here and --aiter was not given: every rule "
                     "applies") == 3


@pytest.mark.parametrize(("choice", "holding"), [
    ("0.1.7", set()),
    ("e4048607", set(RULE_NAMES)),
    ("main", {"flydsl-splitk-counter"}),
    ("absent", set(RULE_NAMES)),
])
def test_aiter_option_names_the_release_as_plan_does(capsys, kinds_table, monkeypatch,
                                                     choice, holding):
    path, rows = kinds_table
    # --aiter wins over whatever aiter is installed.
    monkeypatch.setattr(rules_module, "installed_aiter_root",
                        lambda: pytest.fail("--aiter given: nothing to detect"))
    code = main(["gemm-tables", "capture-safe", str(path), "--check", "--json",
                 "--aiter", choice])
    report = json.loads(capsys.readouterr().out)
    assert code == (1 if holding else 0)
    assert {r["name"] for r in report["rules"] if r["holds"]} == holding
    assert report["aiter"] == ("unknown" if choice == "absent" else
                               f"--aiter {choice}: {SIMULATED_AITERS[choice].read_at}")
    expected = expected_lines(rows, holding)
    assert report["unsafe_rows"] == sum(len(v) for v in expected.values())
    assert report["files"][0]["removed_by_rule"] == {k: len(v) for k, v in expected.items()}


def test_aiter_choices_are_plans():
    assert AITER_CHOICES == ("0.1.7", "e4048607", "main", "absent")
    assert set(rules_module.SIMULATED) == set(AITER_CHOICES) - {"absent"}
    for choice in rules_module.SIMULATED:
        assert [s.rule.name for s in simulated(choice).states] == list(RULE_NAMES)


def test_an_installed_aiter_with_the_fixes_main_has_is_judged_as_aiter_main(tmp_path):
    # #4916 and #4961 in the tree, #4715 not: what --aiter main says of the newest main.
    tree = fake_aiter(tmp_path / "site", {"asm-splitk-semaphore", "opus-splitk-workspace"})
    holds = {s.rule.name: s.holds for s in detect(tree).states}
    assert holds == {s.rule.name: s.holds for s in simulated("main").states}
    assert holds == {"asm-splitk-semaphore": False, "opus-splitk-workspace": False,
                     "flydsl-splitk-counter": True}


REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("choice", AITER_CHOICES)
def test_plan_and_gemm_tables_simulate_the_same_aiter(capsys, kinds_table, choice):
    """``titan-rocm plan --aiter X`` and ``titan-rocm gemm-tables --aiter X`` run with each
    choice: the aiter the plan's machine reports (platform line, MLA routing) is the one whose
    capture rules gemm-tables applies, both from titan_rocm.platform.SIMULATED_AITERS."""
    config = str(REPO / "configs" / "deepseek_v3_debug.toml")
    assert main(["plan", "--arch", "gfx942", "--aiter", choice, "--job.config_file", config,
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    mla = next(w for w in plan["workarounds"] if w["workaround"] == "mla_ck_backward")
    code = main(["gemm-tables", "capture-safe", str(kinds_table[0]), "--check", "--json",
                 "--aiter", choice])
    tables = json.loads(capsys.readouterr().out)
    holding = {r["name"] for r in tables["rules"] if r["holds"]}
    assert code == (1 if holding else 0)
    aiter = SIMULATED_AITERS.get(choice)
    if aiter is None:  # absent: the plan has no aiter, gemm-tables knows none
        assert "aiter absent" in plan["platform"]["summary"] and not mla["applied"]
        assert tables["aiter"] == "unknown" and holding == set(RULE_NAMES)
        return
    assert f"aiter {aiter.version} (API " in plan["platform"]["summary"]
    assert mla["applied"] and mla["details"]["aiter"]["version"] == aiter.version
    assert tables["aiter"] == f"--aiter {choice}: {aiter.read_at}"
    assert holding == {name for name, (holds, _) in rules_module.SIMULATED[choice].items()
                       if holds}


def test_plan_and_gemm_tables_refuse_the_same_names(capsys, kinds_table):
    config = str(REPO / "configs" / "deepseek_v3_debug.toml")
    assert main(["plan", "--arch", "gfx942", "--aiter", "0.2", "--job.config_file",
                 config]) == 2
    plan_err = capsys.readouterr().err
    assert main(["gemm-tables", "capture-safe", str(kinds_table[0]), "--check",
                 "--aiter", "0.2"]) == 2
    tables_err = capsys.readouterr().err
    choices = ", ".join(f"'{c}'" for c in AITER_CHOICES)
    assert f"invalid choice: '0.2' (choose from {choices})" in plan_err
    assert f"accepted: {', '.join(AITER_CHOICES)}" in tables_err


def test_a_bad_aiter_value_exits_2_naming_the_choices(capsys, kinds_table):
    path, _ = kinds_table
    assert main(["gemm-tables", "capture-safe", str(path), "--check", "--aiter", "0.2"]) == 2
    err = capsys.readouterr().err
    assert err == ("titan-rocm gemm-tables: --aiter '0.2' is not valid; accepted: 0.1.7, "
                   "e4048607, main, absent\n")
    with pytest.raises(ValueError, match="accepted: 0.1.7, e4048607, main, absent"):
        simulated("0.2")


def test_asm_rows_without_a_split_are_removed_and_a_bad_split_names_the_line(tmp_path):
    lines = [HEADER]
    base = ("gfx950,256,1,256,5120,False,torch.bfloat16,torch.bfloat16,False,False,asm,5,{},"
            "7.9,k,0,1,1")
    for split in ("", "1", "2", "16.0", "0"):
        lines.append(base.format(split))
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    result = capture_safe([path], None, check=True, aiter="e4048607")
    assert [n.line for n in result.files[0].removed.kept] == [2, 4, 5]
    path.write_text(HEADER + "\n" + base.format("two") + "\n")
    with pytest.raises(ValueError, match=rf"{path}:2: splitK 'two' is not an integer"):
        capture_safe([path], None, check=True, aiter="e4048607")


# --- what docs/gemm-tables.md says -----------------------------------------------------------

DOC = Path(__file__).resolve().parents[3] / "docs" / "gemm-tables.md"


def test_doc_quotes_the_rule_lines(capsys, tmp_path, monkeypatch):
    from tests.support.gemm_table_maker import (
        AITER_COMPOSITION,
        AITER_SPLITK_ZERO,
        split_composition,
    )

    inputs = []
    for i, composition in enumerate(split_composition(AITER_COMPOSITION, 17)):
        path = tmp_path / f"t{i:02d}_bf16_tuned_gemm.csv"
        make_table(path, composition, seed=i,
                   splitk_zero={a: n // 17 for a, n in AITER_SPLITK_ZERO.items()})
        inputs.append(str(path))
    code = main(["gemm-tables", "capture-safe", *inputs, "-o", str(tmp_path / "out"),
                 "--aiter", "main"])
    out, err = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    start = lines.index(f"aiter: --aiter main: {SIMULATED_AITERS['main'].read_at}")
    produced = lines[start:start + 5]
    text = DOC.read_text()
    block = text.split("<!-- rule-lines -->")[1].split("<!-- /rule-lines -->")[0]
    quoted = [line[2:] for line in block.strip().splitlines()[1:-1]]  # inside the fence
    assert quoted == produced
    assert "note:" not in err  # the doc: no cu_num note on tables like aiter's


def test_doc_names_every_rule_with_its_ending_change_and_marker():
    text = DOC.read_text()
    for rule in RULES:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{rule.name}`"))
        pr = rule.ended_by.split()[0]
        assert pr in row and rule.fix.text in row


def test_doc_does_not_call_the_workspace_init_a_fix():
    text = " ".join(DOC.read_text().split())
    assert "does not make these rows safe" in text
    assert "the abort simply relocates to FULL capture" in text
    assert "the rows are safe there and this tool is not needed" not in text


def test_doc_cu_num_note_example_is_what_the_tool_prints(capsys, tmp_path):
    text = " ".join(DOC.read_text().split())
    example = text.split("prints `note: ")[1].split("`")[0]
    table = tmp_path / "t.csv"
    header = HEADER.split(",", 1)[1]
    table.write_text(header + "\n80,1,256,5120,False,torch.bfloat16,torch.bfloat16,False,"
                     "False,opus,204,0,7.9,opus_gemm_flatmm_splitk_a,0.0,1,1\n")
    main(["gemm-tables", "capture-safe", str(table), "--check", "--arch", "gfx950"])
    assert f"note: {example}" in capsys.readouterr().err
