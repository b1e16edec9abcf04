"""The MLA backward routing decision: archs x shapes x flags, bad input, the documented table."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from titan_rocm import archs
from titan_rocm.workarounds.mla_attention import routing
from titan_rocm.workarounds.mla_attention.routing import (
    AITER,
    CK,
    BackwardCall,
    Flags,
    format_route_table,
    route_backward,
    route_table,
)

REPO = Path(__file__).resolve().parent.parent

ARCHS = ("gfx942", "gfx950", "gfx90a", None)  # None: a CUDA machine
SHAPES = {"mla": (192, 128), "mha": (128, 128), "mla_v_padded": (192, 192)}
FLAGS = {
    "plain": Flags(),
    "dropout": Flags(dropout_p=0.1),
    "bias": Flags(has_bias=True),
    "alibi": Flags(has_alibi=True),
    "deterministic": Flags(deterministic=True),
    "fp16": Flags(dtype="float16"),
    "bhsd": Flags(layout="bhsd"),
    "varlen": Flags(layout="thd"),
}

# What each (arch, shape) gets in batch mode, whatever the other flags: CK exactly where
# aiter's fmha_v3 backward must not take q/k 192 (gfx942; gfx90a has no v3 kernels).
EXPECTED = {
    ("gfx942", "mla"): CK,
    ("gfx942", "mha"): AITER,
    ("gfx942", "mla_v_padded"): CK,
    ("gfx950", "mla"): AITER,
    ("gfx950", "mha"): AITER,
    ("gfx950", "mla_v_padded"): AITER,
    ("gfx90a", "mla"): CK,
    ("gfx90a", "mha"): AITER,
    ("gfx90a", "mla_v_padded"): CK,
    (None, "mla"): AITER,
    (None, "mha"): AITER,
    (None, "mla_v_padded"): AITER,
}


def _call(arch, shape, flags: Flags) -> BackwardCall:
    qk, v = SHAPES[shape]
    return BackwardCall(arch, qk, qk, v, **dataclasses.asdict(flags))


@pytest.mark.parametrize("flag", list(FLAGS))
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a or "cuda")
def test_route_table(arch, shape, flag):
    route = route_backward(_call(arch, shape, FLAGS[flag]))
    expected = AITER if flag == "varlen" else EXPECTED[(arch, shape)]
    assert route.backend == expected, route.reason
    assert route.reason  # every decision says why


def test_reasons_name_the_cause():
    mla = route_backward(_call("gfx942", "mla", Flags())).reason
    assert "no q/k 192, v 128 kernel on gfx942" in mla
    padded = route_backward(_call("gfx942", "mla_v_padded", Flags())).reason
    assert "padded" in padded and "never pads v" in padded
    assert "supports q/k 192 with v 128" in route_backward(_call("gfx950", "mla", Flags())).reason
    assert "not an AMD GPU" in route_backward(_call(None, "mla", Flags())).reason
    assert "mha_varlen_bwd" in route_backward(_call("gfx942", "mla", FLAGS["varlen"])).reason


def test_gcn_arch_names_with_features_are_normalized():
    call = BackwardCall("gfx942:sramecc+:xnack-", 192, 192, 128)
    assert call.arch == "gfx942"
    assert route_backward(call).backend == CK


def test_unknown_amd_arch_takes_the_generic_ck_path():
    route = route_backward(BackwardCall("gfx1100", 192, 192, 128))
    assert route.backend == CK and "not an architecture titan-rocm knows" in route.reason
    assert route_backward(BackwardCall("gfx1100", 128, 128, 128)).backend == AITER


def test_decision_reads_the_arch_fact_not_the_arch_name(monkeypatch):
    """Flip gfx942's fact: the route follows it (no arch names hardcoded in routing)."""
    fixed = dataclasses.replace(archs.ARCHS["gfx942"], aiter_fmha_v3_bwd_qk192_v128=True)
    monkeypatch.setitem(archs.ARCHS, "gfx942", fixed)
    assert route_backward(BackwardCall("gfx942", 192, 192, 128)).backend == AITER
    broken = dataclasses.replace(archs.ARCHS["gfx950"], aiter_fmha_v3_bwd_qk192_v128=False)
    monkeypatch.setitem(archs.ARCHS, "gfx950", broken)
    assert route_backward(BackwardCall("gfx950", 192, 192, 128)).backend == CK


@st.composite
def _flags(draw):
    return Flags(
        dropout_p=draw(st.sampled_from([0.0, 0.1, 0.5])),
        has_bias=draw(st.booleans()),
        has_alibi=draw(st.booleans()),
        layout=draw(st.sampled_from(["bshd", "bhsd"])),
        dtype=draw(st.sampled_from(["bfloat16", "float16", "torch.bfloat16"])),
        deterministic=draw(st.booleans()),
    )


@given(
    arch=st.sampled_from([*archs.ARCHS, None, "gfx1100"]),
    qk=st.sampled_from([64, 96, 128, 192, 256]),
    v=st.sampled_from([64, 128, 192, 256]),
    flags=_flags(),
)
def test_batch_mode_flags_never_change_the_route(arch, qk, v, flags):
    """CK's mha_bwd implements dropout, bias, alibi and deterministic: shape and arch decide."""
    base = route_backward(BackwardCall(arch, qk, qk, v))
    assert route_backward(BackwardCall(arch, qk, qk, v, **dataclasses.asdict(flags))) == base
    if base.backend == CK:
        assert qk == 192 and v in (128, 192) and arch is not None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hdim_k": 128}, "hdim_q = 192 and hdim_k = 128 differ"),
        ({"hdim_v": 0}, "hdim_v = 0 is not valid; accepted: a positive int"),
        ({"hdim_q": True}, "hdim_q = True is not valid"),
        ({"dtype": "float32"}, "dtype = 'float32' is not valid .*accepted: bfloat16, float16"),
        ({"layout": "sbhd"}, "layout = 'sbhd' is not valid; accepted: bshd, bhsd, thd"),
        ({"dropout_p": 1.0}, r"dropout_p = 1.0 is not valid; accepted: 0 <= p < 1"),
    ],
)
def test_bad_input_names_value_and_accepted(kwargs, message):
    values = {"arch": "gfx942", "hdim_q": 192, "hdim_k": 192, "hdim_v": 128, **kwargs}
    with pytest.raises(ValueError, match=message):
        BackwardCall(**values)


def test_route_table_rows_are_json_and_complete():
    rows = route_table(flags=list(FLAGS.values()))
    assert len(rows) == len(routing.DEFAULT_TABLE_ARCHS) * len(SHAPES) * len(FLAGS)
    json.dumps(rows)
    row = rows[0]
    assert row["arch"] == "gfx942" and row["shape"] == {"qk": 192, "v": 128}
    assert row["backward"] == "ck (mha_bwd)"
    assert {r["arch"] for r in rows} == {"gfx942", "gfx950", "gfx90a", "cuda"}


def test_docs_show_the_current_route_table():
    """docs/mla-ck-backward.md carries format_route_table(route_table()) verbatim."""
    doc = (REPO / "docs" / "mla-ck-backward.md").read_text()
    assert format_route_table(route_table()) in doc


def test_routing_imports_neither_torch_nor_aiter():
    code = (
        "import sys, titan_rocm.workarounds.mla_attention.routing as r; "
        "r.route_table(); "
        "assert 'torch' not in sys.modules and 'aiter' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith(('torch', 'aiter')))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
