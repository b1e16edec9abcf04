"""The AMDGCN parser: registers, operands, labels, blocks, successors; never raises."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from titan_rocm.scanner.amdgcn import Reg, arch_from_target, parse, parse_register

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "amdgcn"


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("v5", (Reg("v", 5, 5),)),
        ("v[0:3]", (Reg("v", 0, 3),)),
        ("a5", (Reg("a", 5, 5),)),
        ("a[4:7]", (Reg("a", 4, 7),)),
        ("s[8:11]", (Reg("s", 8, 11),)),
        ("s12", (Reg("s", 12, 12),)),
        ("ttmp[4:7]", (Reg("ttmp", 4, 7),)),
        ("v[5]", (Reg("v", 5, 5),)),
        ("V[0:1]", (Reg("v", 0, 1),)),
        ("-v2", (Reg("v", 2, 2),)),
        ("|v3|", (Reg("v", 3, 3),)),
        ("v0.l", (Reg("v", 0, 0),)),
        ("[v0,v1,v2]", (Reg("v", 0, 0), Reg("v", 1, 1), Reg("v", 2, 2))),
        ("vcc", (Reg("vcc", 0, 0),)),
        ("exec", (Reg("exec", 0, 0),)),
        ("m0", (Reg("m0", 0, 0),)),
        ("0", ()),
        ("0x27000", ()),
        ("1.0", ()),
        ("off", ()),
        (".LBB0_3", ()),
        ("vmcnt(0)", ()),
        ("v", ()),
        ("v[", ()),
        ("values", ()),
        ("", ()),
    ],
)
def test_parse_register(token: str, expected: tuple[Reg, ...]) -> None:
    assert parse_register(token) == expected


def test_register_overlap_is_per_file() -> None:
    data = Reg("v", 0, 3)
    assert data.overlaps(Reg("v", 3, 4))
    assert data.overlaps(Reg("v", 1, 1))
    assert not data.overlaps(Reg("v", 4, 5))
    assert not data.overlaps(Reg("a", 0, 3))  # AGPRs are distinct registers
    assert not Reg("s", 0, 3).overlaps(Reg("v", 0, 3))
    assert str(data) == "v[0:3]" and str(Reg("a", 5, 5)) == "a5"


def test_operands_and_modifiers() -> None:
    prog = parse(
        "buffer_store_dwordx4 v[0:3], v36, s[8:11], 0 offen offset:16 sc0 sc1 nt\n"
        "buffer_store_dwordx4 v[4:7], v36, s[16:19], s12 offen\n"
        "v_pk_fma_f32 v[2:3], v[2:3], v[32:33], 1.0 op_sel_hi:[1,1,0]\n"
        "tbuffer_store_format_xyzw v[0:3], v4, s[0:3], dfmt:14, nfmt:7, 0 idxen\n"
        "s_waitcnt vmcnt(0) lgkmcnt(0)\n"
    )
    store, sgpr_store, fma, tbuf, wait = prog.instructions
    assert store.mnemonic == "buffer_store_dwordx4"
    assert store.operands == ("v[0:3]", "v36", "s[8:11]", "0")
    assert store.modifiers == ("offen", "offset:16", "sc0", "sc1", "nt")
    assert sgpr_store.operands[3] == "s12"
    assert fma.operands == ("v[2:3]", "v[2:3]", "v[32:33]", "1.0")
    assert fma.modifiers == ("op_sel_hi:[1,1,0]",)
    assert tbuf.operands == ("v[0:3]", "v4", "s[0:3]", "0")
    assert wait.args == "vmcnt(0) lgkmcnt(0)"
    assert store.regs(0) == (Reg("v", 0, 3),) and store.regs(9) == ()


def test_comments_directives_labels_and_line_numbers() -> None:
    text = (
        '\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"\n'  # 1
        "\t.text\n"  # 2
        "my_kernel:                  ; @my_kernel\n"  # 3
        "\t.loc\t1 8 26 prologue_end  ; k.py:8:26\n"  # 4
        "; %bb.0:\n"  # 5
        "\tV_MOV_B32 V0, V1 ; upper case, trailing comment\n"  # 6
        "\tv_mov_b32 v2, v3 // slash comment\n"  # 7
        ".Lx: s_nop 2\n"  # 8
        "\ts_endpgm\n"  # 9
    )
    prog = parse(text)
    assert [(i.line, i.text) for i in prog.instructions] == [
        (6, "v_mov_b32 V0, V1"),
        (7, "v_mov_b32 v2, v3"),
        (8, "s_nop 2"),
        (9, "s_endpgm"),
    ]
    assert prog.kernels == ["my_kernel"]
    assert prog.arch == "gfx942"
    assert prog.labels == {"my_kernel": 0, ".Lx": 1}
    assert prog.instructions[2].wait_states == 3
    assert prog.kernel_of(prog.instructions[3]) == "my_kernel"


@pytest.mark.parametrize(
    ("line", "expected"),
    [("s_nop 0", 1), ("s_nop 1", 2), ("s_nop 7", 8), ("s_nop 0x3", 4), ("s_nop", 1),
     ("s_nop junk", 1), ("v_mov_b32 v0, v1", 1), ("s_waitcnt vmcnt(0)", 1)],
)
def test_wait_states(line: str, expected: int) -> None:
    assert parse(line).instructions[0].wait_states == expected


def test_blocks_and_successors() -> None:
    text = "\n".join(
        [
            "k:",
            "  s_mov_b32 s0, 0",  # block 0
            ".LBB0_1:",
            "  s_add_u32 s0, s0, 1",  # block 1: loop body
            "  s_cbranch_scc1 .LBB0_1",  # back-edge and fallthrough
            "  s_cbranch_execz .LBB0_3",  # block 2
            "  s_branch .LBB0_4",  # block 3
            ".LBB0_3:",
            "  s_setpc_b64 s[30:31]",  # block 4: ends
            ".LBB0_4:",
            "  s_endpgm",  # block 5: ends
            "  v_mov_b32 v0, 0",  # block 6: dead code after s_endpgm
        ]
    )
    prog = parse(text)
    succ = [b.successors for b in prog.blocks]
    assert succ == [[1], [1, 2], [4, 3], [5], [], [], []]
    assert prog.block_of == [0, 1, 1, 2, 3, 4, 5, 6]
    assert prog.pos_in_block == [0, 0, 1, 0, 0, 0, 0, 0]
    assert [b.name for b in prog.blocks[:2]] == ["k", ".LBB0_1"]
    assert prog.blocks[2].name == "line 6"


def test_branch_to_unknown_label_keeps_fallthrough() -> None:
    prog = parse("s_cbranch_scc0 .Lnowhere\nv_mov_b32 v0, 0\ns_branch .Lnowhere\n")
    assert [b.successors for b in prog.blocks] == [[1], []]


def test_target_forms() -> None:
    assert arch_from_target("amdgcn-amd-amdhsa--gfx942") == "gfx942"
    assert arch_from_target("amdgpu9.42-amd-amdhsa-unknown-gfx942") == "gfx942"
    assert arch_from_target("amdgcn-amd-amdhsa--gfx950:sramecc+:xnack-") == "gfx950"
    assert arch_from_target("amdgcn-amd-amdhsa--GFX90A") == "gfx90a"
    assert arch_from_target("x86_64") is None
    assert arch_from_target(None) is None


def test_metadata_and_debug_sections_are_not_code() -> None:
    text = "\n".join(
        [
            "k:",
            "  v_mov_b32 v0, 0",
            "  s_endpgm",
            "  .section .debug_info,\"\",@progbits",
            ".Ldebug_info_start0:",
            "  .byte 1",
            "  .amdgpu_metadata",
            "---",
            "amdhsa.kernels:",
            "  - .name: k",
            "    .sgpr_count: 32",
            "  .end_amdgpu_metadata",
            "  .text",
            "k2:",
            "  s_endpgm",
        ]
    )
    prog = parse(text)
    assert [i.text for i in prog.instructions] == ["v_mov_b32 v0, 0", "s_endpgm", "s_endpgm"]
    assert prog.kernels == ["k", "k2"]
    assert ".Ldebug_info_start0" not in prog.labels and "amdhsa.kernels" not in prog.labels


def test_real_triton_output() -> None:
    prog = parse((CORPUS / "swiglu_bwd-gfx942-buf.amdgcn").read_text())
    assert prog.kernels == ["swiglu_bwd"]
    assert prog.arch == "gfx942"
    stores = [i for i in prog.instructions if i.mnemonic == "buffer_store_dwordx4"]
    assert len(stores) == 2
    assert stores[0].regs(0) == (Reg("v", 0, 3),)
    assert prog.instructions[-1].mnemonic == "s_endpgm"
    # Every instruction is attributed to exactly one block, in order.
    assert [i.index for b in prog.blocks for i in b.instructions] == list(
        range(len(prog.instructions))
    )


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "\x00\xff\xfe", "v_mov_b32 v[", "s_nop 0xzz", "buffer_store_dwordx4",
     "v_mov_b32 v[99999999999999999999999:1], v[3:0]", ":", "a:b:c:", "\r\n\r", "[[[",
     ".amdgcn_target", ".section", ".amdgpu_metadata\nfoo:", "label: ; x", "s_branch",
     "s_cbranch_scc0", "v_swap_b32", "\u2028v_mov_b32 v0, v1"],
)
def test_odd_inputs_do_not_raise(text: str) -> None:
    prog = parse(text)
    for ins in prog.instructions:
        ins.valu_vector_defs(), ins.vector_defs(), ins.wait_states, ins.branch_target


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_never_raises_on_text(text: str) -> None:
    prog = parse(text)
    for ins in prog.instructions:
        ins.vector_defs(), ins.wait_states, ins.operands


@settings(max_examples=200, deadline=None)
@given(st.binary())
def test_parse_never_raises_on_bytes(data: bytes) -> None:
    parse(data)
