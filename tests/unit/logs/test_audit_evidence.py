"""The log readers on an audited run read every line the audit leaves as evidence (issue 37):
the end-of-audit line and the part headers beside the per-step verdict line, the stop and the
quarantine lines; a verdict line cut or split by other output is never ``ok``; what was wrong
is named (a segment's output or gradients) against the report's reference; a log that stops
with no end of training fails ``check-log --require-complete``.

Real output of both generations (tests/fixtures/logs): TorchTitan 0.2.2's trainer with the
spread audit (``tt_cpu_audit_first_step_*.log``, generate_torchtitan.sh) and 0.3.0's with a
fault in block 0's compiled forward and the float32 reference
(``tt030_cpu_audit_forward_float32_flagged.log``, from
tests/tt030/test_tt030_audit_logs.py::test_a_forward_flag_against_a_float32_reference_is_named_so).
"""

from __future__ import annotations

import ast
import json
import tarfile
from pathlib import Path

import pytest

from tests.support.log_tools import run_tools
from titan_rocm import audit_message
from titan_rocm.cli import main
from titan_rocm.logs.check import EXIT_ERROR, EXIT_FLAGGED, EXIT_OK, exit_code_of
from titan_rocm.logs.parse import parse_text
from titan_rocm.logs.summary import summarize
from titan_rocm.logs.verdict import FLAGGED, OK, UNREADABLE, verdict_of

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
TT022 = FIXTURES / "tt_cpu_audit_first_step_flagged.log"
TT022_CLEAN = FIXTURES / "tt_cpu_audit_first_step_clean.log"
TT022_STOP = FIXTURES / "tt_cpu_audit_first_step_stop.log"
TT030 = FIXTURES / "tt030_cpu_audit_forward_float32_flagged.log"
H200 = (ROOT / "benchmarks" / "results" / "2026-12-02-h200"
        / "audit-matrix-train-fault-deepseek-fwd" / "logs.tar.gz")
"""A stored H200 run (TorchTitan 0.2.2, deepseek_v3 3.9B, bf16): a fault in block 6's compiled
forward, the float32 (TF32 GEMMs) reference, flagged by the in-training spread audit at step 6
(docs/numerics-audit.md)."""
END = "titan-rocm numerics audit begun at step"


def _h200(tmp_path: Path) -> Path:
    with tarfile.open(H200) as tar:
        member = tar.extractfile("logs/deepseek_v3_4b.log")
        assert member is not None
        path = tmp_path / "deepseek_v3_4b.log"
        path.write_bytes(member.read())
    return path


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


def _flagged_line(lines: list[str]) -> int:
    """The index of the first FLAGGED verdict line."""
    return next(i for i, line in enumerate(lines) if "numerics audit at step" in line
                and ": FLAGGED" in line)


def _verdict(text: str) -> tuple[str, int, bool]:
    """Status, check-log's exit code, bench-summary's validity."""
    log = parse_text(text)
    verdict = verdict_of([log])
    return verdict.status, exit_code_of(verdict), summarize([log], warmup=0).valid


@pytest.mark.parametrize("path", [TT022, TT030, pytest.param(H200, marks=pytest.mark.slow)],
                         ids=["tt022", "tt030", "h200"])
def test_a_flagged_verdict_line_cut_at_any_byte_is_never_ok(path: Path, tmp_path: Path) -> None:
    """Cut at every byte: the rest of the log after it (the lost bytes), the next line glued
    to the cut (a lost line end), or the log ending there. With the end-of-audit line after
    it the run is flagged; without any flag left to read, unreadable (check-log exit 2)."""
    lines = _lines(_h200(tmp_path) if path == H200 else path)
    at = _flagged_line(lines)
    line = lines[at]
    seen: dict[str, set[str]] = {"rest": set(), "glued": set(), "end": set()}
    for cut in range(len(line) + 1):
        texts = {
            "rest": "\n".join([*lines[:at], line[:cut], *lines[at + 1:]]),
            "glued": "\n".join([*lines[:at], line[:cut] + lines[at + 1], *lines[at + 2:]]),
            "end": "\n".join([*lines[:at], line[:cut]]),
        }
        for mode, text in texts.items():
            status, code, valid = _verdict(text)
            assert status != OK and code in (EXIT_FLAGGED, EXIT_ERROR) and not valid, (
                mode, cut, line[:cut][-40:], status)
            seen[mode].add(status)
            if mode != "end":  # the end-of-audit line says "flagged at step(s) 1"
                assert status == FLAGGED, (mode, cut, status)
    assert seen["end"] == {FLAGGED, UNREADABLE}  # unreadable while "FLAGGED" is not whole


def test_a_cut_verdict_without_the_end_line_is_unreadable_in_every_tool(tmp_path: Path) -> None:
    """Without the end-of-audit line (lost too, or an audit in one step), a verdict cut
    before its word is unreadable: check-log 2, bench-summary invalid, compare 1."""
    lines = [line for line in _lines(TT022) if END not in line]
    at = _flagged_line(lines)
    lines[at] = lines[at][:lines[at].index(": FLAGGED") + 4]  # "... at step 1: FL"
    path = tmp_path / "cut.log"
    path.write_text("\n".join(lines), encoding="utf-8")
    tools = run_tools(path, TT022_CLEAN)
    verdict = tools.check["verdict"]
    assert tools.check_code == 2 and verdict["status"] == "unreadable", verdict
    assert verdict["label"] == "numerics audit verdict unreadable"
    assert "cut or split by other output" in verdict["reason"]
    assert verdict["audit_unreadable"][0]["line"] == at + 1
    assert tools.bench_code == 1 and tools.bench["valid"] is False
    assert tools.compare_code == 1
    assert tools.compare["compare_verdict"] == "numerics audit verdict unreadable"


@pytest.mark.parametrize("prefixed", [True, False], ids=["torchrun-prefixes", "no-prefixes"])
def test_a_verdict_line_split_by_another_ranks_output_is_never_ok(prefixed: bool) -> None:
    """Another rank's line written into the middle of the verdict line, the rest of the
    verdict line after it: flagged (the end line), or unreadable without the end line."""
    other = next(line for line in _lines(FIXTURES / "tt_cpu_2rank_guard_nan_step7_rank1.log")
                 if line.startswith("[default1]:") and "step:" in line)
    other = other.removeprefix("[default1]:")
    lines = _lines(TT022)
    if prefixed:
        lines = [f"[rank0]:{line}" if line else line for line in lines]
    at = _flagged_line(lines)
    line = lines[at]
    for cut in range(line.index("numerics audit"), len(line), 7):
        inserted = f"[rank1]:{other}" if prefixed else other
        split = [*lines[:at], line[:cut] + inserted, line[cut:], *lines[at + 1:]]
        status, code, _ = _verdict("\n".join(split))
        assert status == FLAGGED and code == EXIT_FLAGGED, (cut, status)
        without_end = [x for x in split if END not in x]
        status, code, _ = _verdict("\n".join(without_end))
        assert status in (FLAGGED, UNREADABLE) and code != EXIT_OK, (cut, status)
        whole = line[cut:].startswith("ED") or cut > line.index(": FLAGGED") + len(": FLAGGED")
        assert (status == FLAGGED) == whole, (cut, line[:cut][-20:], status)


def test_the_end_of_audit_line_flags_the_run_whatever_happened_to_the_verdict_line() -> None:
    """The verdict line gone entirely: the end line's "flagged at step(s) 1" is the flag, and
    the lost verdict's report (its header's reference, its "first wrong in the" line) still
    names what was wrong."""
    lines = _lines(TT022)
    at = _flagged_line(lines)
    log = parse_text("\n".join(lines[:at] + lines[at + 1:]))
    verdict = verdict_of([log])
    assert verdict.status == FLAGGED and verdict.step == 1
    assert verdict.audit is not None and verdict.audit.seen_in == "end-of-audit line"
    assert "block 0's gradients (backward)" in verdict.reason
    assert "float64 reference" in verdict.reason
    assert "end-of-audit line" in verdict.reason and len(verdict.audits_unread) == 1
    # a cut end line alone is unreadable, never a clean audit
    clean = _lines(TT022_CLEAN)
    end = next(i for i, line in enumerate(clean) if END in line)
    for cut in range(clean[end].index("begun at step") + 13, len(clean[end]) - 1):
        text = "\n".join([*clean[:end], clean[end][:cut], *clean[end + 1:]])
        assert _verdict(text)[0] == UNREADABLE, clean[end][:cut]


@pytest.mark.parametrize("path, what, reference, not_said", [
    (TT022, "block 0's gradients (backward)", "the float64 reference", "output (forward)"),
    (TT030, "block 0's output (forward) and block 0's gradients (backward)",
     "the float32 reference", "float64"),
], ids=["tt022-backward-float64", "tt030-forward-float32"])
def test_the_flag_names_what_was_wrong_and_against_which_reference(
        path: Path, what: str, reference: str, not_said: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    main(["check-log", str(path)])
    out = capsys.readouterr().out
    assert f"{what}, compiled, are further from {reference} than eager's" in out, out
    assert not_said not in out and "disagree with eager and float64" not in out, out
    code = main(["check-log", "--json", str(path)])
    verdict = json.loads(capsys.readouterr().out)["files"][0]["verdict"]
    assert code == 4 and verdict["audit_flagged"]["reference"] == reference.split()[1]
    assert verdict["audit_flagged"]["wrong"][0]["segment"] == "block 0"
    assert verdict["audit_flagged"]["part"] == "part 1 of 3: block 0"


def test_a_forward_fault_on_the_h200_is_named_against_the_tf32_reference(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: a forward flag against a float32 (TF32) reference was reported as
    "the compiled gradients disagree with eager and float64"."""
    code = main(["check-log", str(_h200(tmp_path))])
    out = capsys.readouterr().out
    assert code == 4 and "flagged step 6" in out, out
    assert ("block 6's output (forward) and block 6's gradients (backward), compiled, are "
            "further from the float32 (TF32 GEMMs) reference than eager's") in out, out
    assert "float64" not in out


def test_a_report_naming_the_child_inside_a_block_names_the_block() -> None:
    """Inside a block the report names the first wrong child after the block
    (``block 0, attention_norm:``, docs/numerics-audit.md#inside-a-block): the readers take
    the block, never ``block 0,``."""
    text = TT030.read_text(encoding="utf-8").replace(
        "first wrong in the forward: block 0: layers.0 output",
        "first wrong in the forward: block 0, attention_norm: layers.0.attention_norm output")
    assert "block 0, attention_norm:" in text
    verdict = verdict_of([parse_text(text)])
    assert verdict.status == FLAGGED
    assert "block 0's output (forward) and block 0's gradients (backward)" in verdict.reason
    assert "block 0," not in verdict.reason


def test_a_tf32_reference_is_named_as_the_report_names_it() -> None:
    """On a GPU a bfloat16 job's reference is float32 with TF32 GEMMs; the report's lines
    name it ``float32 (TF32 GEMMs)`` (numerics/precision.py, Reference.name), the readers
    too (the 0.3.0 run's lines with that name)."""
    text = TT030.read_text(encoding="utf-8").replace(
        "reference float32", "reference float32 (TF32 GEMMs)")
    verdict = verdict_of([parse_text(text)])
    assert "the float32 (TF32 GEMMs) reference" in verdict.reason, verdict.reason
    lines = text.split("\n")
    at = _flagged_line(lines)
    del lines[at]  # the verdict line lost: its part header still names the reference
    assert "the float32 (TF32 GEMMs) reference" in verdict_of([parse_text("\n".join(lines))]
                                                            ).reason


def test_the_0_3_0_run_names_its_second_flagged_step_too() -> None:
    """Its last part (the parts outside the blocks) flags the end-to-end loss at step 3: no
    "first wrong in the" line, so no segment is named for it."""
    verdict = verdict_of([parse_text(TT030.read_text(encoding="utf-8"))])
    assert [m.step for m in verdict.audits_flagged] == [1, 3]
    assert "it flagged step(s) 3 too" in verdict.reason


def test_check_log_names_the_audits_stop_and_the_guards(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    code = main(["check-log", str(TT022_STOP)])
    out = capsys.readouterr().out
    assert code == 4
    assert "stop: the numerics audit's stop policy stopped the run at step 1 (line 67)." in out
    main(["check-log", "--json", str(TT022_STOP)])
    verdict = json.loads(capsys.readouterr().out)["files"][0]["verdict"]
    assert verdict["stop"] == {"by": "numerics audit", "step": 1, "line": 67}
    guarded = FIXTURES / "tt_cpu_guard_nan_step7.log"
    assert main(["check-log", str(guarded)]) == 1
    out = capsys.readouterr().out
    assert "stop: the divergence guard stopped the run at step 7 (line 13)." in out, out
    # the stop line alone (its verdict line cut) is the flag
    lines = _lines(TT022_STOP)
    at = _flagged_line(lines)
    text = "\n".join([*lines[:at], lines[at][:80], *lines[at + 1:]])
    verdict_ = verdict_of([parse_text(text)])
    assert verdict_.status == FLAGGED and verdict_.stop is not None
    assert verdict_.stop.by == "numerics audit" and verdict_.stop.step == 1


def _quarantined(tmp_path: Path, cut_verdict: bool = False) -> Path:
    """The real flagged run with the quarantine's two lines where the policy writes them:
    after the flagged report, and the cost after the unaudited steps."""
    lines = _lines(TT022)
    at = _flagged_line(lines)
    why = "first wrong in the backward: block 0: layers.0.feed_forward.w3.weight: rmse 0.242"
    quarantine = ("[titan] 2026-12-02 10:14:29,274 - titan_rocm - WARNING - "
                  + audit_message.quarantined_line(1, "block 0", why, 3.64, 3.91))
    cost = ("[titan] 2026-12-02 10:14:31,359 - titan_rocm - INFO - "
            + audit_message.quarantine_cost_line("block 0", 2, 0.0301, 0.0392))
    report_end = next(i for i in range(at + 1, len(lines)) if lines[i].startswith("[titan]"))
    done = next(i for i, line in enumerate(lines) if "Training completed" in line)
    if cut_verdict:
        lines[at] = lines[at][:70]
    out = [*lines[:report_end], quarantine, *lines[report_end:done], cost, *lines[done:]]
    path = tmp_path / "quarantined.log"
    path.write_text("\n".join(out), encoding="utf-8")
    return path


def test_a_quarantined_run_is_flagged_and_protected_never_clean(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _quarantined(tmp_path)
    line = next(i for i, x in enumerate(_lines(path)) if "quarantined block 0 (" in x) + 1
    log = parse_text(path.read_text(encoding="utf-8"))
    assert sorted({r.step for r in log.records}) == [1, 2, 3]  # no metric from its lines
    tools = run_tools(path, TT022_CLEAN)
    verdict = tools.check["verdict"]
    assert tools.check_code == 4 and verdict["status"] == "flagged", verdict
    assert verdict["label"] == "numerics audit flagged at step 1, block 0 quarantined"
    assert verdict["quarantined"] == [{"step": 1, "segment": "block 0", "line": line,
                                       "cost_ratio": "1.30"}]
    assert f"block 0 was quarantined at step 1 (line {line})" in verdict["reason"]
    assert "at 1.30 x the step time" in verdict["reason"]
    assert tools.bench_code == 1 and tools.bench["valid"] is False
    assert "after a quarantine" in tools.bench["reason"]
    assert tools.compare_code == 1 and "quarantined" in tools.compare["compare_verdict"]
    # the quarantine line alone (the verdict line cut before its word) is the flag
    cut = verdict_of([parse_text(_quarantined(tmp_path, cut_verdict=True).read_text())])
    assert cut.status == FLAGGED and [q.segment for q in cut.quarantines] == ["block 0"]
    capsys.readouterr()


def test_require_complete_fails_a_log_cut_mid_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A log that stops mid-line after its last step, with no crash marker and no end of
    training: ok as far as it goes, but --require-complete exits 3 and the report says why."""
    text = (FIXTURES / "tt_cpu_clean.log").read_text(encoding="utf-8")
    stop = text.index("Sleeping 2 seconds") + 8
    path = tmp_path / "cut.log"
    path.write_text(text[:stop], encoding="utf-8")
    assert main(["check-log", "--require-complete", str(path)]) == 3
    out = capsys.readouterr().out
    assert "it stops mid-line (line 14, no line end)" in out, out
    assert "--require-complete fails it" in out
    assert main(["check-log", str(path)]) == 0
    capsys.readouterr()
    main(["check-log", "--json", str(path)])
    verdict = json.loads(capsys.readouterr().out)["files"][0]["verdict"]
    assert verdict["completed"] is False and verdict["status"] == "ok"
    # the whole log passes; a rank whose last line is "Process group destroyed" (0.2.2 logs
    # "Training completed" on rank 0 only) has finished too
    whole = tmp_path / "whole.log"
    whole.write_text(text, encoding="utf-8")
    assert main(["check-log", "--require-complete", str(whole)]) == 0
    other_rank = tmp_path / "rank1.log"
    other_rank.write_text(text.replace("Training completed", "(rank 1)"), encoding="utf-8")
    assert main(["check-log", "--require-complete", str(other_rank)]) == 0
    ends_at_line_end = tmp_path / "ends.log"
    ends_at_line_end.write_text(text[:text.index("[titan]", stop)], encoding="utf-8")
    assert main(["check-log", "--require-complete", str(ends_at_line_end)]) == 3
    capsys.readouterr()


def test_the_log_readers_import_no_module_in_a_circle() -> None:
    """Issue 39: parse <-> tables (Record imported back under TYPE_CHECKING). Every import
    between modules of titan_rocm/logs counts, TYPE_CHECKING and function-level ones too."""
    package = ROOT / "titan_rocm" / "logs"
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        name = f"titan_rocm.logs.{path.stem}"
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t.startswith("titan_rocm.logs.")
                            and t != name}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            assert state.get(nxt) != 1, f"import circle: {' -> '.join([*path, node, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


@pytest.mark.parametrize("path, status", [(TT022_CLEAN, OK), (TT022, FLAGGED)],
                         ids=["clean", "flagged"])
def test_ranks_printing_without_a_prefix_are_no_lost_verdicts(path: Path, status: str) -> None:
    """Two ranks writing to one stream without prefixes (no torchrun --tee, srun without
    --label): each rank's part header, then each rank's verdict. Every header has its
    verdict: nothing is unreadable; losing one rank's verdict line is."""
    doubled = [line for line in _lines(path) for _ in range(2)]
    verdict = verdict_of([parse_text("\n".join(doubled))])
    assert verdict.status == status and verdict.audits_unread == (), verdict.reason
    at = next(i for i, line in enumerate(doubled) if "numerics audit at step 2: OK" in line)
    del doubled[at]
    verdict = verdict_of([parse_text("\n".join(doubled))])
    assert len(verdict.audits_unread) == 1 and verdict.status != OK, verdict.reason


def test_headers_of_audits_outside_training_claim_no_verdict(tmp_path: Path) -> None:
    """The audit matrix (a stored H200 run) audits after training in the same process: its
    headers ("numerics audit: 16 blocks, ...") have no verdict line, as the command line's
    have none; they are no lost verdict. The same header right before a log that stops
    mid-line is."""
    tar_path = H200.parents[1] / "audit-matrix-cost-spread4" / "logs.tar.gz"
    with tarfile.open(tar_path) as tar:
        member = tar.extractfile("logs/llama3_1b.log")
        assert member is not None
        text = member.read().decode("utf-8")
    assert text.count("numerics audit: 16 blocks") == 3
    verdict = verdict_of([parse_text(text)])
    assert verdict.status == OK and verdict.audits_unread == (), verdict.reason
    header = text.index("numerics audit: 16 blocks")
    cut = text[:text.index("\n", header) + 1] + "[titan] 2026-12-02 10:01:04,700 - titan_rocm"
    assert verdict_of([parse_text(cut)]).status == UNREADABLE
