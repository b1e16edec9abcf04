"""The buffer-store data hazard rules, clause by clause, and on the real Triton corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from titan_rocm import archs
from titan_rocm.scanner.hazards import CLI_RULES, RULES, get_rule
from titan_rocm.scanner.scan import ScanReport, scan_path, scan_text

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "amdgcn"
FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "amdgcn"

LIT = "buffer_store_dwordx4 v[0:3], v36, s[8:11], 0 offen offset:16 sc0 sc1 nt"
SGPR = "buffer_store_dwordx4 v[0:3], v36, s[16:19], s12 offen"


def kernel(*body: str, arch: str | None = "gfx942", name: str = "k") -> str:
    """A one-kernel AMDGCN text around ``body`` lines."""
    head = [f'\t.amdgcn_target "amdgcn-amd-amdhsa--{arch}"'] if arch else []
    return "\n".join([*head, "\t.text", f"{name}:", *(f"\t{b}" for b in body), "\ts_endpgm", ""])


def scan(*body: str, rule: str = "precise", arch: str | None = "gfx942") -> ScanReport:
    return scan_text(kernel(*body, arch=arch), rule=rule)


def gaps(report: ScanReport) -> list[tuple[int, int]]:
    """(wait states found, required) of each hazard."""
    return [(h.wait_states, h.required) for h in report.hazards]


# --- the wait-state window ------------------------------------------------------------


def test_literal_soffset_needs_two_wait_states() -> None:
    assert gaps(scan(LIT, "v_mov_b32 v1, 0")) == [(0, 2)]
    assert scan(LIT, "v_mov_b32 v1, 0").hazards[0].path == "straight line"
    assert gaps(scan(LIT, "s_mov_b32 s0, 0", "v_mov_b32 v1, 0")) == [(1, 2)]
    assert gaps(scan(LIT, "s_mov_b32 s0, 0", "s_mov_b32 s1, 0", "v_mov_b32 v1, 0")) == []


def test_sgpr_soffset_needs_one_wait_state() -> None:
    assert gaps(scan(SGPR, "v_mov_b32 v1, 0")) == [(0, 1)]
    assert gaps(scan(SGPR, "s_mov_b32 s0, 0", "v_mov_b32 v1, 0")) == []


def test_conservative_needs_two_for_every_soffset() -> None:
    assert gaps(scan(SGPR, "s_mov_b32 s0, 0", "v_mov_b32 v1, 0", rule="conservative")) == [
        (1, 2)
    ]
    assert gaps(scan(SGPR, "s_nop 1", "v_mov_b32 v1, 0", rule="conservative")) == []


def test_s_nop_counts_k_plus_one() -> None:
    assert gaps(scan(LIT, "s_nop 0", "v_mov_b32 v1, 0")) == [(1, 2)]
    assert gaps(scan(LIT, "s_nop 1", "v_mov_b32 v1, 0")) == []
    assert gaps(scan(SGPR, "s_nop 0", "v_mov_b32 v1, 0")) == []


def test_comments_labels_directives_cost_nothing() -> None:
    report = scan(
        LIT,
        "; a comment line",
        ".loc 1 16 5 is_stmt 0  ; k.py:16:5",
        ".p2align 2",
        "// another comment",
    )
    assert report.hazards == []  # nothing writes
    with_writer = scan(LIT, "; comment", ".loc 1 2 3", ".Ltmp7:", "v_mov_b32 v3, v9")
    assert gaps(with_writer) == [(0, 2)]


def test_other_stores_and_loads_count_as_wait_states() -> None:
    assert gaps(scan(LIT, "buffer_store_dword v9, v36, s[8:11], 0 offen", "s_nop 0",
                     "v_mov_b32 v0, 0")) == []


# --- which registers and which writers -----------------------------------------------


@pytest.mark.parametrize(
    ("writer", "hazard"),
    [
        ("v_mov_b32 v0, 0", True),
        ("v_mov_b32 v3, 0", True),
        ("v_mov_b32 v4, 0", False),
        ("v_pk_mul_f32 v[2:3], v[4:5], v[6:7]", True),
        ("v_lshlrev_b64 v[3:4], 1, v[8:9]", True),
        ("v_pk_mul_f32 v[4:5], v[0:1], v[2:3]", False),  # reads the data: fine
        ("v_and_b32_sdwa v1, v0, v37 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:WORD_1", True),
        ("v_mov_b32_dpp v2, v9 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf", True),
        ("v_cvt_pk_bf16_f32 v0, v12, v13", True),
        ("v_swap_b32 v5, v1", True),  # v_swap writes both operands
        ("v_swap_b32 v1, v5", True),
        ("v_swap_b32 v5, v6", False),
        ("v_readfirstlane_b32 s2, v0", False),  # SGPR destination
        ("v_readlane_b32 s2, v0, 3", False),
        ("v_cmp_gt_i32_e64 s[0:1], v0, v1", False),
        ("v_cmp_o_f32_e32 vcc, v0, v0", False),
        ("v_add_co_u32_e64 v2, s[0:1], v4, v5", True),
        ("v_writelane_b32 v2, s0, 1", True),
        ("v_accvgpr_read_b32 v1, a1", True),
        ("v_accvgpr_write_b32 a1, v9", False),  # AGPR a1 is not VGPR v1
        ("v_movreld_b32 v40, v9", True),  # M0-relative: any VGPR
        ("v_nop", False),
        ("v_dual_mov_b32 v9, v1 :: v_dual_add_f32 v2, v3, v4", True),  # VOPD: both halves
        ("v_dual_mov_b32 v9, v1 :: v_dual_add_f32 v8, v3, v4", False),
        ("buffer_load_dwordx4 v[0:3], v36, s[4:7], 0 offen", False),  # a load, not VALU
        ("global_load_dword v1, v[8:9], off", False),
        ("ds_read_b32 v2, v10", False),
        ("s_mov_b32 s0, 0", False),
    ],
)
def test_writers(writer: str, hazard: bool) -> None:
    assert bool(scan(LIT, writer).hazards) is hazard


def test_agpr_data() -> None:
    store = "buffer_store_dwordx4 a[0:3], v36, s[8:11], 0 offen"
    assert gaps(scan(store, "v_accvgpr_write_b32 a2, v9")) == [(0, 2)]
    assert gaps(scan(store, "v_mfma_f32_32x32x8_bf16 a[0:15], v[0:1], v[2:3], 0")) == [(0, 2)]
    assert gaps(scan(store, "v_mov_b32 v2, 0")) == []


@pytest.mark.parametrize(
    ("store", "checked"),
    [
        ("buffer_store_dwordx3 v[0:2], v36, s[8:11], 0 offen", 1),
        ("buffer_store_dwordx4 v[0:3], off, s[8:11], 0 offset:16", 1),
        ("buffer_store_b96 v[0:2], v36, s[8:11], 0 offen", 1),
        ("buffer_store_b128 v[0:3], v36, s[8:11], 0 offen", 1),
        ("tbuffer_store_format_xyzw v[0:3], v4, s[8:11], dfmt:14, nfmt:7, 0 idxen", 1),
        ("buffer_store_dwordx2 v[0:1], v36, s[8:11], 0 offen", 0),  # 64 bits: no hazard
        ("buffer_store_b64 v[0:1], v36, s[8:11], 0 offen", 0),
        ("buffer_store_short v0, v36, s[8:11], 0 offen", 0),
        ("buffer_store_format_d16_xyzw v[0:1], v36, s[8:11], 0 offen", 0),
    ],
)
def test_store_widths(store: str, checked: int) -> None:
    report = scan(store, "v_mov_b32 v0, 0")
    assert report.stores_checked == checked
    assert len(report.hazards) == checked


def test_mtbuf_sgpr_soffset() -> None:
    store = "tbuffer_store_format_xyzw v[0:3], v4, s[8:11], s5 format:[BUF_FMT_32_32_32_32_FLOAT]"
    assert gaps(scan(store, "v_mov_b32 v0, 0")) == [(0, 1)]
    assert gaps(scan(store, "s_nop 0", "v_mov_b32 v0, 0")) == []


def test_global_stores_are_information_only() -> None:
    report = scan("global_store_dwordx4 v[38:39], v[0:3], off", "s_nop 1", "v_mov_b32 v0, 0",
                  "v_mov_b32 v38, 0")
    assert report.hazards == [] and report.stores_checked == 0 and not report.hazardous
    assert [(i.kind, i.line, i.unprotected) for i in report.info] == [("global", 4, False)]


def test_unprotected_global_store_is_reported_not_hazardous() -> None:
    """llvm-project #202333: LLVM dropped the s_nop after a wide global store in a
    divergent branch. Recompiling cannot fix that, so it is information, with the writer."""
    report = scan("global_store_dwordx4 v26, v[34:37], s[20:21]", "s_or_b64 exec, exec, s[34:35]",
                  "v_pk_mul_f32 v[36:37], v[2:3], v[4:5]")
    assert report.hazards == [] and not report.hazardous  # nothing for the wrapper to do
    (info,) = report.info
    assert info.unprotected
    assert (info.writer, info.wait_states, info.required) == (
        "v_pk_mul_f32 v[36:37], v[2:3], v[4:5]", 1, 2)
    assert scan("global_store_dwordx4 v26, v[34:37], s[20:21]", "v_mov_b32 v0, 0",
                rule="naive").info[0].unprotected is False  # naive checks buffer stores only
    flat = scan("flat_store_dwordx3 v[8:9], v[0:2]", "global_store_dwordx2 v[8:9], v[0:1], off")
    assert [i.kind for i in flat.info] == ["flat"]  # dwordx2 is not wider than 64 bits


# --- retiring waits -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait", "retires"),
    [
        ("s_waitcnt vmcnt(0)", True),
        ("s_waitcnt vmcnt(0) lgkmcnt(0)", True),
        ("s_waitcnt 0", True),
        ("s_waitcnt_vscnt null, 0x0", True),
        ("s_wait_storecnt 0x0", True),
        ("s_waitcnt vmcnt(1)", False),
        ("s_waitcnt lgkmcnt(0)", False),
        ("s_waitcnt_vscnt null, 0x1", False),
        ("s_waitcnt 0x3f70", True),  # vmcnt bits 3:0 and 15:14 all 0 (expcnt, lgkmcnt max)
        ("s_waitcnt 0xc070", False),  # vmcnt 48: only its high bits (15:14) are set
    ],
)
def test_waits_that_retire_the_store(wait: str, retires: bool) -> None:
    # One wait state from the wait itself: a hazard unless the wait retired the store.
    assert (scan(LIT, wait, "v_mov_b32 v0, 0").hazards == []) is retires


@pytest.mark.parametrize(("imm", "vmcnt"), [(0x4F7F, 31), (0xCF7E, 62), (0x0F70, 0), (0x0F71, 1)])
def test_gfx9_vmcnt_field_is_archs(imm: int, vmcnt: int) -> None:
    # LLVM's own encodings (llvm/test/MC/AMDGPU/sopp-gfx9.s at c1898945), read from archs.py.
    assert archs.gfx9_waitcnt_vmcnt(imm) == vmcnt


@pytest.mark.parametrize(("arch", "counted"), [(None, True), ("gfx942", True), ("gfx950", True),
                                               ("gfx1100", False), ("gfx1250", False)])
def test_which_archs_count_stores_in_vmcnt(arch: str | None, counted: bool) -> None:
    assert archs.stores_counted_by_vmcnt(arch) is counted
    # and the rule follows: on gfx10+ vmcnt(0) leaves the store in flight
    assert (scan(LIT, "s_waitcnt vmcnt(0)", "v_mov_b32 v0, 0", arch=arch).hazards == []) \
        is counted


# --- control flow -------------------------------------------------------------------------


def test_branch_target_is_followed() -> None:
    report = scan(LIT, "s_cbranch_scc1 .LBB0_2", "s_nop 7", ".LBB0_2:", "v_mov_b32 v0, 0")
    assert gaps(report) == [(1, 2)]
    assert report.hazards[0].path == "s_cbranch_scc1 to .LBB0_2"


def test_fallthrough_of_conditional_branch_is_followed() -> None:
    report = scan(LIT, "s_cbranch_execz .LBB0_9", "v_mov_b32 v2, 0", ".LBB0_9:", "s_nop 7")
    assert gaps(report) == [(1, 2)]
    assert report.hazards[0].path == "s_cbranch_execz not taken"


def test_unconditional_branch_skips_fallthrough() -> None:
    assert scan(LIT, "s_branch .LBB0_5", "v_mov_b32 v0, 0", ".LBB0_5:", "s_nop 7",
                "v_mov_b32 v0, 0").hazards == []
    assert gaps(scan(LIT, "s_branch .LBB0_5", "s_nop 7", ".LBB0_5:", "v_mov_b32 v1, 0")) == [
        (1, 2)
    ]


def test_loop_back_edge() -> None:
    body = [".LBB0_1:", "v_mov_b32 v0, 1.0", "s_nop 7", LIT, "s_add_u32 s8, s8, 1"]
    back_edge = scan(*body[:-1], "s_cbranch_scc1 .LBB0_1")
    assert gaps(back_edge) == [(1, 2)]
    assert back_edge.hazards[0].path == "s_cbranch_scc1 to .LBB0_1"
    assert scan(*body, "s_cbranch_scc1 .LBB0_1").hazards == []  # s_add + branch: 2


@pytest.mark.parametrize(
    "end", ["s_endpgm", "s_setpc_b64 s[30:31]", "s_swappc_b64 s[30:31], s[4:5]"]
)
def test_path_ends(end: str) -> None:
    assert scan(LIT, end, "v_mov_b32 v0, 0").hazards == []


def test_worst_path_is_reported() -> None:
    report = scan(LIT, "s_cbranch_scc1 .LBB0_2", "s_nop 0", "v_mov_b32 v1, 0", "s_endpgm",
                  ".LBB0_2:", "v_mov_b32 v0, 0")
    assert gaps(report) == [(1, 2)] and report.hazards[0].writer == "v_mov_b32 v0, 0"


def test_kernels_are_named() -> None:
    text = kernel(LIT, "s_nop 1", name="first") + kernel(SGPR, "v_mov_b32 v0, 0", arch=None,
                                                         name="second")
    report = scan_text(text)
    assert [(h.kernel, h.line) for h in report.hazards] == [("second", 9)]
    assert report.kernels == ["first", "second"]


# --- architectures ------------------------------------------------------------------------


def test_arch_from_text_and_override() -> None:
    hazardous = kernel(LIT, "v_mov_b32 v0, 0", arch="gfx950")
    assert scan_text(hazardous).arch == "gfx950"
    assert scan_text(hazardous).arch_status == "affected"
    # No architecture is exempt (AMD-AGI/Primus's _on_rocm() gate): one without hazard-window
    # facts is scanned as if affected, and the report says so.
    other = scan_text(hazardous, arch="gfx90a")
    assert other.arch == "gfx90a" and other.arch_status == "unknown"
    assert [h.line for h in other.hazards] == [h.line for h in scan_text(hazardous).hazards]
    assert any("no hazard-window facts for gfx90a" in n for n in other.notes)
    assert scan_text(hazardous, arch="gfx942:sramecc+:xnack-").arch == "gfx942"


def test_gfx1250_is_scanned_as_if_affected() -> None:
    assert scan(LIT, "v_mov_b32 v0, 0", arch="gfx1250").hazards != []


@pytest.mark.parametrize("arch", [None, "gfx1100"])
def test_unknown_arch_is_scanned_and_said(arch: str | None) -> None:
    report = scan(LIT, "v_mov_b32 v0, 0", arch=arch)
    assert report.arch == arch and report.arch_status == "unknown"
    assert len(report.hazards) == 1
    assert report.notes and "scanned as if" in report.notes[0]


def test_unknown_rule() -> None:
    with pytest.raises(ValueError, match="'strict'.*precise, conservative, naive"):
        scan_text("", rule="strict")
    assert get_rule(RULES["precise"]) is RULES["precise"]


# --- the naive rule (benchmark baseline) --------------------------------------------------


def test_naive_rule_flags_any_redefinition_before_a_vmem_wait() -> None:
    late = (LIT, "s_nop 7", "v_mov_b32 v0, 0")
    assert scan(*late).hazards == []
    assert gaps(scan(*late, rule="naive")) == [(8, -1)]
    assert scan(LIT, "buffer_load_dword v1, v9, s[4:7], 0 offen", rule="naive").hazards
    assert scan(LIT, "s_waitcnt vmcnt(3)", "v_mov_b32 v0, 0", rule="naive").hazards == []


# --- real Triton 3.9.0 output -------------------------------------------------------------


def corpus_reports(rule: str) -> list[ScanReport]:
    return scan_path(CORPUS, rule=rule)


def test_corpus_is_clean_under_precise_and_conservative() -> None:
    for rule in ("precise", "conservative"):
        reports = corpus_reports(rule)
        assert len(reports) == 44
        assert sum(r.stores_checked for r in reports) == 34
        assert [h for r in reports for h in r.hazards] == [], rule
        assert all(r.arch in ("gfx942", "gfx950") and r.arch_status == "affected"
                   for r in reports)


def test_naive_rule_false_positives_on_corpus() -> None:
    reports = corpus_reports("naive")
    flagged = [h for r in reports for h in r.hazards]
    assert len(flagged) == 13
    assert len({h.file for h in flagged}) == 9
    # None is a real hazard: the writer is a load (not the VALU), or a VALU instruction at
    # least the 2 wait states the hardware needs after a literal-soffset store.
    loads = [h for h in flagged if h.writer.startswith("buffer_load")]
    valu = [h for h in flagged if h.writer.startswith("v_")]
    assert len(loads) + len(valu) == len(flagged) and loads and valu
    assert all(h.wait_states >= 2 for h in valu)
    assert any(h.path.startswith("s_cbranch_scc1 to ") for h in flagged)  # loop back-edges


def test_buffer_ops_off_turns_each_wide_buffer_store_into_a_global_store() -> None:
    reports = {Path(r.file or "").name: r for r in scan_path(CORPUS)}
    pairs = [(r, reports[name.replace("-buf.", "-nobuf.")])
             for name, r in reports.items() if name.endswith("-buf.amdgcn")]
    assert len(pairs) == 22
    for on, off in pairs:
        assert on.info == [] and off.stores_checked == 0
        if "scale_rows" not in str(off.file):  # its loop is unrolled differently
            assert len(off.info) == on.stores_checked, off.file
        assert bool(off.info) == bool(on.stores_checked), off.file
        assert not any(i.unprotected for i in off.info), off.file  # LLVM kept 2 wait states


def _swiglu() -> str:
    return (CORPUS / "swiglu_bwd-gfx942-buf.amdgcn").read_text()


def test_real_kernel_with_injected_hazard() -> None:
    """What Triton 3.4/3.5 emitted: an SGPR-soffset store with the data rewritten next. The
    fixture docs/triton-buffer-store-hazard.md scans is this kernel."""
    text = _swiglu()
    store = "buffer_store_dwordx4 v[0:3], v36, s[8:11], 0 offen"
    assert text.count(store) == 1
    line = text[: text.index(store)].count("\n") + 1
    hazardous = text.replace(store, store.replace(" 0 offen", " s12 offen")
                             + "\n\tv_pk_mul_f32 v[0:1], v[18:19], v[14:15]")
    assert (FIXTURE / "swiglu_bwd-gfx942-sgpr-soffset.amdgcn").read_text() == hazardous
    report = scan_text(hazardous, file="swiglu")
    assert [(h.line, h.writer_line, h.wait_states, h.required, h.kernel) for h in
            report.hazards] == [(line, line + 1, 0, 1, "swiglu_bwd")]
    # One wait state in between: fixed for the precise rule, not for the conservative one.
    spaced = text.replace(store, store.replace(" 0 offen", " s12 offen")
                          + "\n\ts_nop 0\n\tv_pk_mul_f32 v[0:1], v[18:19], v[14:15]")
    assert scan_text(spaced).hazards == []
    assert len(scan_text(spaced, rule="conservative").hazards) == 1


# --- never raises -----------------------------------------------------------------------

_LINES = [
    LIT, SGPR, "buffer_store_dwordx3 a[0:2], v1, s[0:3], s4 offen", "v_mov_b32 v0, 0",
    "v_swap_b32 v1, v2", "v_mfma_f32_4x4x1f32 a[0:3], v0, v1, a[0:3]", "s_nop 0", "s_nop 1",
    "s_waitcnt vmcnt(0)", "s_waitcnt vmcnt(1)", "s_cbranch_scc1 .L1", "s_cbranch_execz .L2",
    "s_branch .L1", "s_branch .L3", ".L1:", ".L2:", "s_endpgm", "s_setpc_b64 s[30:31]",
    "global_store_dwordx4 v[4:5], v[0:3], off", "v_readfirstlane_b32 s0, v1",
    "buffer_load_dwordx4 v[0:3], v9, s[0:3], 0 offen", "; comment", ".loc 1 2 3", "k2:",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_LINES), max_size=40))
def test_rules_never_raise_and_precise_is_within_conservative(lines: list[str]) -> None:
    text = "\n".join(lines)
    precise = scan_text(text, arch="gfx942")
    conservative = scan_text(text, arch="gfx942", rule="conservative")
    scan_text(text, arch="gfx942", rule="naive")
    assert {h.line for h in precise.hazards} <= {h.line for h in conservative.hazards}
    for h in precise.hazards:
        assert 0 <= h.wait_states < h.required <= 2


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.binary()), st.sampled_from(sorted(RULES)))
def test_scan_never_raises(data: str | bytes, rule: str) -> None:
    report = scan_text(data, rule=rule)
    assert report.stores_checked >= len(report.hazards)


# --- the shortcut (TextView) agrees with the full parse -----------------------------------

_MORE_LINES = [
    *_LINES, "BUFFER_STORE_DWORDX4 V[0:3], V9, S[0:3], 0 OFFEN", "V_MOV_B32 V1, 0",
    "s_branch", "s_cbranch_vccz", ".L3:", "other_kernel:", ".L1: v_mov_b32 v0, 0",
    ".section .debug_info", ".text", "\t.amdgpu_metadata", "\t.end_amdgpu_metadata",
    "flat_store_dwordx3 v[0:1], v[2:4]", "scratch_store_dwordx4 v0, v[0:3], off",
    "tbuffer_store_format_xyzw v[0:3], v4, s[8:11], s5 format:[BUF_FMT_32_32_32_32_FLOAT]",
    "buffer_atomic_cmpswap_x2 v[0:3], v4, s[8:11], 0 offen", "v_movreld_b32 v9, v1",
    "s_nop 0 ; buffer_store_dwordx4 v[0:3], v1, s[0:3], 0", "junk, buffer_store", "\u00e9_store",
]


def _full(text: str, rule: str) -> ScanReport:
    from titan_rocm.scanner.amdgcn import parse
    from titan_rocm.scanner.scan import scan_program

    return scan_program(parse(text), rule=rule)


def _same(quick: ScanReport, full: ScanReport) -> None:
    assert quick.hazards == full.hazards
    assert quick.stores_checked == full.stores_checked
    assert quick.info == full.info
    assert quick.kernels == full.kernels
    assert quick.has_code == full.has_code
    assert (quick.arch, quick.arch_status, quick.notes) == (full.arch, full.arch_status,
                                                            full.notes)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_MORE_LINES), max_size=40), st.sampled_from(CLI_RULES))
def test_shortcut_matches_full_parse(lines: list[str], rule: str) -> None:
    text = "\n".join(lines)
    _same(scan_text(text, rule=rule), _full(text, rule))


def test_shortcut_matches_full_parse_on_corpus() -> None:
    for f in sorted(CORPUS.glob("*.amdgcn")):
        text = f.read_text()
        for rule in CLI_RULES:
            _same(scan_text(text, rule=rule), _full(text, rule))


def test_shortcut_is_taken_for_clean_triton_output() -> None:
    from titan_rocm.scanner.amdgcn import TextView

    view = TextView(_swiglu())
    assert view.simple
    result = RULES["precise"].quick_check(view, "gfx942")
    assert result is not None and result.stores_checked == 2
    hazardous = _swiglu().replace(
        "buffer_store_dwordx4 v[0:3], v36, s[8:11], 0 offen",
        "buffer_store_dwordx4 v[0:3], v36, s[8:11], 0 offen\n\tv_mov_b32 v1, 0",
    )
    assert RULES["precise"].quick_check(TextView(hazardous), "gfx942") is None
    # A non-ASCII path in a .file directive ("ß".upper() is two characters) changes nothing.
    unicode = _swiglu().replace('"tests/corpus"', '"/home/jürgen/ẞß"')
    quick = RULES["precise"].quick_check(TextView(unicode), "gfx942")
    assert quick is not None and quick.stores_checked == 2
    _same(scan_text(unicode), _full(unicode, "precise"))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet=list("va[]:0123 \n\t;.,_/sbufer_toglbmicxn"))))
def test_shortcut_matches_full_parse_on_any_text(text: str) -> None:
    _same(scan_text(text), _full(text, "precise"))
