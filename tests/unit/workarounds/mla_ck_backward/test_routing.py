"""The MLA routing decision, both directions: archs x shapes x flags x aiter releases (and the
change markers an aiter's files hold) x what aiter's get_gfx() answers; the per-release table;
bad input; the documented tables."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from titan_rocm import archs
from titan_rocm.platform import SIMULATED_AITERS
from titan_rocm.workarounds.mla_ck_backward import aiter_releases
from titan_rocm.workarounds.mla_ck_backward.aiter_releases import release_for
from titan_rocm.workarounds.mla_ck_backward.routing import (
    AITER,
    CK,
    AttentionCall,
    Flags,
    format_route_table,
    route_backward,
    route_forward,
    route_table,
)

REPO = Path(__file__).resolve().parents[4]

PYPI = "0.1.7.post2.dev18"
MAIN = "main"
FLYDSL = frozenset({"#4875"})
"""The markers of aiter main with ROCm/aiter#4875."""
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
    "not_causal": Flags(causal=False),
}


def _call(arch, shape, flags: Flags | None = None, **aiter) -> AttentionCall:
    qk, v = SHAPES[shape]
    return AttentionCall(arch, qk, qk, v, **dataclasses.asdict(flags or Flags()), **aiter)


# -- backward ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [PYPI, MAIN, None], ids=["pypi", "main", "unknown"])
@pytest.mark.parametrize("flag", list(FLAGS))
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a or "cuda")
def test_backward_goes_to_ck_only_for_mla_where_the_arch_lacks_the_kernel(arch, shape, flag,
                                                                          version):
    """CK exactly for q/k 192, v 128 on gfx942/gfx90a, dense or varlen, any flags, any
    release; v padded to 192 is left to aiter (gfx942 has q/k 192 = v 192 fmha_v3 kernels)."""
    route = route_backward(_call(arch, shape, FLAGS[flag], aiter_version=version))
    expected = CK if (arch in ("gfx942", "gfx90a") and shape == "mla") else AITER
    assert route.backend == expected, route.reason
    assert route.reason and route.kernel
    if expected == CK:
        assert route.function == ("mha_varlen_bwd" if flag == "varlen" else "mha_bwd")


def test_padded_v_is_aiters_own_choice_with_the_reason():
    route = route_backward(_call("gfx942", "mla_v_padded"))
    assert route.backend == AITER
    assert "is not DeepSeek MLA's q/k 192, v 128" in route.reason


@pytest.mark.parametrize(
    ("version", "aiter_gfx", "says"),
    [
        (PYPI, None, "aiter's own gates pick CK mha_bwd too when get_gfx() answers gfx942"),
        (PYPI, "gfx950", "0.1.7's gfx950 gate takes this shape only without a causal mask"),
        (MAIN, "gfx950", "0.1.16+ would send this call to fmha_v3_bwd, which gfx942 lacks"),
        (None, "gfx950", "its gfx950 gate may send this call to fmha_v3_bwd"),
    ],
)
def test_gfx942_backward_reason_says_what_aiter_would_do(version, aiter_gfx, says):
    route = route_backward(_call("gfx942", "mla", aiter_gfx=aiter_gfx, aiter_version=version))
    assert route.backend == CK
    assert "no fmha_v3 backward kernel for q/k 192, v 128 on gfx942" in route.reason
    assert says in route.reason


@pytest.mark.parametrize(
    ("version", "causal", "kernel"),
    [
        (PYPI, True, "CK mha_bwd"),  # 0.1.7's gfx950 gate needs nmask (finding 6)
        (PYPI, False, "fmha_v3_bwd (ASM) for seqlen_q > 16, else CK mha_bwd"),
        ("0.1.10", True, "CK mha_bwd"),
        ("0.1.11", True, "fmha_v3_bwd (ASM) for seqlen_q > 16, else CK mha_bwd"),
        (MAIN, True, "fmha_v3_bwd (ASM) for seqlen_q > 16, else CK mha_bwd"),
        (None, True, "aiter's choice"),
    ],
)
def test_gfx950_backward_kernel_per_release(version, causal, kernel):
    route = route_backward(_call("gfx950", "mla", Flags(causal=causal), aiter_version=version))
    assert route.backend == AITER and route.kernel == kernel, route.reason


def test_gfx950_with_aiter_answering_gfx942_still_goes_to_aiter_which_runs_ck():
    route = route_backward(_call("gfx950", "mla", aiter_gfx="gfx942", aiter_version=MAIN))
    assert route.backend == AITER and route.kernel == "CK mha_bwd"
    assert "get_gfx() answers gfx942 on this gfx950" in route.reason


def test_varlen_backward_never_takes_fmha_v3_for_mla():
    for arch in ("gfx942", "gfx950"):
        for version in (PYPI, MAIN):
            route = route_backward(_call(arch, "mla", FLAGS["varlen"], aiter_version=version))
            assert route.kernel.startswith("CK mha_varlen_bwd"), (arch, version)


# -- #4875: aiter main's FlyDSL varlen backward for q/k 192, v 128 on gfx942 ------------------


def test_4875_varlen_backward_on_gfx942_is_left_to_aiters_flydsl_kernel():
    """aiter main with #4875 sends a causal bf16 varlen q/k 192, v 128 backward on gfx942 to
    its FlyDSL kernel: titan-rocm leaves it to aiter, asks for contiguous tensors, says why."""
    call = _call("gfx942", "mla", FLAGS["varlen"], aiter_version=MAIN, aiter_markers=FLYDSL)
    route = route_backward(call)
    assert route.label == "aiter (_flash_attn_varlen_backward)"
    assert route.kernel == "flydsl_flash_attn_varlen_bwd (FlyDSL)" and route.contiguous
    assert "can_impl_fmha_bwd_flydsl, ROCm/aiter #4875" in route.reason
    assert "validated on gfx942 against an fp32 reference" in route.reason
    # The same aiter without the marker (main at e4048607 reports the same version): CK.
    without = route_backward(_call("gfx942", "mla", FLAGS["varlen"], aiter_version=MAIN))
    assert without.label == "ck (mha_varlen_bwd)" and not without.contiguous
    # Deterministic is not read by the gate; the FlyDSL kernel uses no atomics.
    deterministic = Flags(layout="thd", deterministic=True)
    assert route_backward(_call("gfx942", "mla", deterministic, aiter_version=MAIN,
                                aiter_markers=FLYDSL)).kernel == route.kernel
    # The dense backward is not #4875's: CK, as aiter's own gates pick.
    dense = route_backward(_call("gfx942", "mla", Flags(), aiter_version=MAIN,
                                 aiter_markers=FLYDSL))
    assert dense.label == "ck (mha_bwd)" and "aiter's own gates pick CK mha_bwd too" in dense.reason


@pytest.mark.parametrize(("flags", "why"), [
    (Flags(layout="thd", causal=False), "only causal bf16 calls without dropout or alibi"),
    (Flags(layout="thd", dtype="float16"), "only causal bf16 calls without dropout or alibi"),
    (Flags(layout="thd", dropout_p=0.1), "only causal bf16 calls without dropout or alibi"),
    (Flags(layout="thd", has_alibi=True), "only causal bf16 calls without dropout or alibi"),
])
def test_4875_gate_refusals_keep_ck_on_gfx942(flags, why):
    route = route_backward(_call("gfx942", "mla", flags, aiter_version=MAIN,
                                 aiter_markers=FLYDSL))
    assert route.backend == CK and why in route.reason, route.reason


@pytest.mark.parametrize(("arch", "aiter_gfx", "backend", "says"), [
    # An MI300X whose aiter is told gfx950: #4875's gate refuses, aiter runs CK; so does ours.
    ("gfx942", "gfx950", CK, "FlyDSL gate takes q/k 192, v 128 only when get_gfx() answers "
     "gfx942 (here gfx950), so it runs CK mha_varlen_bwd too"),
    # An MI355X whose aiter is told gfx942: aiter would run the gfx942 kernel there: CK.
    ("gfx950", "gfx942", CK, "would run its FlyDSL kernel, written and validated for gfx942 "
     "only; CK mha_varlen_bwd, which aiter runs when get_gfx() answers gfx950, computes it"),
    ("gfx90a", "gfx942", CK, "written and validated for gfx942 only"),
    # gfx950 told gfx950: the gate is gfx942's; aiter runs CK itself.
    ("gfx950", None, AITER, "FlyDSL gate takes q/k 192, v 128 only when get_gfx() answers "
     "gfx942 (here gfx950): aiter runs CK mha_varlen_bwd itself"),
])
def test_4875_flydsl_only_on_the_arch_it_was_written_for(arch, aiter_gfx, backend, says):
    route = route_backward(_call(arch, "mla", FLAGS["varlen"], aiter_gfx=aiter_gfx,
                                 aiter_version=MAIN, aiter_markers=FLYDSL))
    assert route.backend == backend and route.kernel == "CK mha_varlen_bwd", route
    assert says in route.reason, route.reason


def test_4875_route_reads_the_release_row(monkeypatch):
    """Take the gate out of #4875's row: titan-rocm calls CK again; give it gfx950 too: the
    mis-detected MI355X is left to aiter's FlyDSL kernel."""
    call = _call("gfx942", "mla", FLAGS["varlen"], aiter_version=MAIN, aiter_markers=FLYDSL)
    mismatched = _call("gfx950", "mla", FLAGS["varlen"], aiter_gfx="gfx942", aiter_version=MAIN,
                       aiter_markers=FLYDSL)
    assert route_backward(call).backend == AITER and route_backward(mismatched).backend == CK
    *older, last = aiter_releases.RELEASES
    gone = dataclasses.replace(last, varlen_bwd_flydsl_gate=frozenset())
    monkeypatch.setattr(aiter_releases, "RELEASES", (*older, gone))
    assert route_backward(call).backend == CK
    wider = dataclasses.replace(last, varlen_bwd_flydsl_kernels=frozenset({"gfx942", "gfx950"}))
    monkeypatch.setattr(aiter_releases, "RELEASES", (*older, wider))
    assert route_backward(mismatched).kernel == "flydsl_flash_attn_varlen_bwd (FlyDSL)"


# -- forward ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "arch", "aiter_gfx", "backend", "kernel"),
    [
        # PyPI 0.1.7: gfx942 has no q/k 192 fmha_v3 forward; its gate opens only for gfx950.
        (PYPI, "gfx942", None, AITER, "CK mha_fwd"),
        (PYPI, "gfx942", "gfx950", CK, "CK mha_fwd"),  # aiter alone: "invalid argument"
        (PYPI, "gfx950", None, AITER, "fmha_v3_fwd (ASM) for seqlen_q > 128, else CK mha_fwd"),
        (PYPI, "gfx950", "gfx942", AITER, "CK mha_fwd"),
        (PYPI, "gfx90a", "gfx950", CK, "CK mha_fwd"),
        # v0.1.8-v0.1.15: the gate has no arch check; gfx90a has no fmha_v3 at all.
        ("0.1.9", "gfx90a", None, CK, "CK mha_fwd"),
        ("0.1.9", "gfx942", "gfx950", AITER,
         "fmha_v3_fwd (ASM) for seqlen_q > 128, else CK mha_fwd"),
        # main (v0.1.16+): gfx942 has q/k 192, v 128 kernels; the gate asks for gfx942/gfx950.
        (MAIN, "gfx942", None, AITER, "fmha_v3_fwd (ASM) for seqlen_q > 128, else CK mha_fwd"),
        (MAIN, "gfx942", "gfx950", AITER,
         "fmha_v3_fwd (ASM) for seqlen_q > 128, else CK mha_fwd"),
        (MAIN, "gfx90a", None, AITER, "CK mha_fwd"),
        (MAIN, "gfx90a", "gfx950", CK, "CK mha_fwd"),
        # version unknown: only a mismatch is routed.
        (None, "gfx942", None, AITER, "aiter's choice"),
        (None, "gfx942", "gfx950", CK, "CK mha_fwd"),
    ],
)
def test_forward_route_and_kernel_per_release(version, arch, aiter_gfx, backend, kernel):
    route = route_forward(_call(arch, "mla", aiter_gfx=aiter_gfx, aiter_version=version))
    assert (route.backend, route.kernel) == (backend, kernel), route.reason


def test_varlen_forward_has_no_seqlen_threshold_and_its_own_functions():
    route = route_forward(_call("gfx942", "mla", FLAGS["varlen"], aiter_version=MAIN))
    assert route.label == "aiter (_flash_attn_varlen_forward)"
    assert route.kernel == "fmha_v3_varlen_fwd (ASM)"
    routed = route_forward(_call("gfx942", "mla", FLAGS["varlen"], aiter_gfx="gfx950",
                                 aiter_version=PYPI))
    assert routed.label == "ck (mha_varlen_fwd)" and "'invalid argument'" in routed.reason


@pytest.mark.parametrize("flag", ["dropout", "bias", "fp16"])
def test_forward_flags_that_close_aiters_v3_gate_leave_ck_to_aiter(flag):
    route = route_forward(_call("gfx950", "mla", FLAGS[flag], aiter_version=MAIN))
    assert route.backend == AITER and route.kernel == "CK mha_fwd"
    mismatch = route_forward(_call("gfx942", "mla", FLAGS[flag], aiter_gfx="gfx950",
                                   aiter_version=PYPI))
    assert mismatch.backend == AITER  # aiter's gate would not pick fmha_v3: nothing to route


@pytest.mark.parametrize("shape", ["mha", "mla_v_padded"])
def test_forward_leaves_other_shapes_to_aiter(shape):
    route = route_forward(_call("gfx942", shape, aiter_gfx="gfx950", aiter_version=PYPI))
    assert route.backend == AITER and route.kernel == "aiter's choice"


# -- inputs, facts ----------------------------------------------------------------------------


def test_gcn_arch_names_with_features_are_normalized():
    call = AttentionCall("gfx942:sramecc+:xnack-", 192, 192, 128, aiter_gfx="GFX950")
    assert (call.arch, call.aiter_gfx) == ("gfx942", "gfx950")
    assert route_backward(call).backend == CK


def test_unknown_amd_arch_takes_the_generic_ck_path():
    route = route_backward(AttentionCall("gfx1100", 192, 192, 128))
    assert route.backend == CK and "not an architecture titan-rocm knows" in route.reason
    assert route_backward(AttentionCall("gfx1100", 128, 128, 128)).backend == AITER


def test_backward_reads_the_arch_fact_not_the_arch_name(monkeypatch):
    """Flip gfx942's fact: the route follows it (no arch names hardcoded in routing)."""
    fixed = dataclasses.replace(archs.ARCHS["gfx942"], aiter_fmha_v3_bwd_qk192_v128=True)
    monkeypatch.setitem(archs.ARCHS, "gfx942", fixed)
    assert route_backward(AttentionCall("gfx942", 192, 192, 128)).backend == AITER
    broken = dataclasses.replace(archs.ARCHS["gfx950"], aiter_fmha_v3_bwd_qk192_v128=False)
    monkeypatch.setitem(archs.ARCHS, "gfx950", broken)
    assert route_backward(AttentionCall("gfx950", 192, 192, 128)).backend == CK


def test_what_aiter_would_do_reads_the_told_arch_fact_not_its_name(monkeypatch):
    """The reason for an arch without the kernel follows the fact of the arch aiter is told:
    gfx950's answer stops meaning "its gate may send it to fmha_v3_bwd" once gfx950 lacks
    the kernel, and gfx90a's starts meaning it once gfx90a has it."""
    call = _call("gfx942", "mla", aiter_gfx="gfx950", aiter_version=None)
    assert "its gfx950 gate may send this call to fmha_v3_bwd" in route_backward(call).reason
    broken = dataclasses.replace(archs.ARCHS["gfx950"], aiter_fmha_v3_bwd_qk192_v128=False)
    monkeypatch.setitem(archs.ARCHS, "gfx950", broken)
    assert "aiter's own gates pick CK mha_bwd too when get_gfx() answers gfx950" in \
        route_backward(call).reason
    fixed = dataclasses.replace(archs.ARCHS["gfx90a"], aiter_fmha_v3_bwd_qk192_v128=True)
    monkeypatch.setitem(archs.ARCHS, "gfx90a", fixed)
    told_gfx90a = route_backward(_call("gfx942", "mla", aiter_gfx="gfx90a", aiter_version=None))
    assert "its gfx90a gate may send this call to fmha_v3_bwd" in told_gfx90a.reason


def test_forward_reads_the_release_table(monkeypatch):
    """Give PyPI 0.1.7 gfx942 kernels: the mis-detected forward is no longer routed."""
    call = AttentionCall("gfx942", 192, 192, 128, aiter_gfx="gfx950", aiter_version=PYPI)
    assert route_forward(call).backend == CK
    first = aiter_releases.RELEASES[0]
    patched = dataclasses.replace(first, fwd_v3_qk192_kernels=frozenset({"gfx942", "gfx950"}))
    monkeypatch.setattr(aiter_releases, "RELEASES", (patched, *aiter_releases.RELEASES[1:]))
    assert route_forward(call).backend == AITER


@pytest.mark.parametrize(
    ("version", "row"),
    [("0.1.7.post2.dev18", "0.1.7"), ("0.1.6", "0.1.7"), ("0.1.8", "0.1.8-0.1.10"),
     ("v0.1.10.post3", "0.1.8-0.1.10"), ("0.1.11", "0.1.11-0.1.15"), ("0.1.15.post3",
     "0.1.11-0.1.15"), ("0.1.16", "0.1.16+"), ("0.1.20.post1", "0.1.16+"),
     ("0.1.21.dev3+ge4048607", "0.1.16+"), ("main", "0.1.16+")],
)
def test_release_rows_by_version(version, row):
    assert release_for(version).name == row


@pytest.mark.parametrize("version", [None, "", "unknown", "0+local"])
def test_unknown_versions_have_no_row(version):
    assert release_for(version) is None
    assert release_for(version, FLYDSL) is None


@pytest.mark.parametrize(
    ("version", "markers", "row"),
    [("main", FLYDSL, "main with #4875"), ("0.1.21.dev0", FLYDSL, "main with #4875"),
     ("0.1.21.dev0", frozenset(), "0.1.16+"), ("main", frozenset(), "0.1.16+"),
     ("0.1.20.post1", FLYDSL, "0.1.16+"), ("0.1.7.post2.dev18", FLYDSL, "0.1.7")],
)
def test_a_marker_row_needs_its_marker_and_its_version(version, markers, row):
    """aiter main reports a 0.1.21 development version with and without #4875: its files
    decide."""
    assert release_for(version, markers).name == row


def test_unknown_marker_names_the_value_and_the_accepted_ones():
    with pytest.raises(ValueError, match=r"aiter_markers = #9999 is not valid; accepted: #4875"):
        AttentionCall("gfx942", 192, 192, 128, aiter_markers={"#9999"})


@st.composite
def _flags(draw):
    return Flags(
        dropout_p=draw(st.sampled_from([0.0, 0.1, 0.5])),
        has_bias=draw(st.booleans()),
        has_alibi=draw(st.booleans()),
        layout=draw(st.sampled_from(["bshd", "bhsd", "thd"])),
        dtype=draw(st.sampled_from(["bfloat16", "float16", "torch.bfloat16"])),
        causal=draw(st.booleans()),
        deterministic=draw(st.booleans()),
    )


@given(
    arch=st.sampled_from([*archs.ARCHS, None, "gfx1100"]),
    qk=st.sampled_from([64, 96, 128, 192, 256]),
    v=st.sampled_from([64, 128, 192, 256]),
    flags=_flags(),
    version=st.sampled_from([PYPI, "0.1.9", "0.1.12", MAIN, None]),
    markers=st.sampled_from([frozenset(), FLYDSL]),
    aiter_gfx=st.sampled_from([None, "gfx942", "gfx950"]),
)
# The one call #4875's FlyDSL gate takes, which random draws rarely reach.
@example(arch="gfx942", qk=192, v=128, flags=Flags(layout="thd"), version=MAIN,
         markers=FLYDSL, aiter_gfx=None)
def test_backward_backend_depends_on_shape_and_arch_only(arch, qk, v, flags, version, markers,
                                                         aiter_gfx):
    """CK's mha_bwd implements every flag: only the shape and the real arch decide, but for
    the one call #4875's FlyDSL kernel takes on its own arch (left to aiter)."""
    call = AttentionCall(arch, qk, qk, v, **dataclasses.asdict(flags), aiter_gfx=aiter_gfx,
                         aiter_version=version, aiter_markers=markers)
    route = route_backward(call)
    flydsl = (arch == "gfx942" and (qk, v) == (192, 128) and version == MAIN and markers
              and flags.layout == "thd" and flags.causal and flags.dtype.endswith("bfloat16")
              and flags.dropout_p == 0.0 and not flags.has_alibi
              and aiter_gfx in (None, "gfx942"))
    if flydsl:
        assert (route.backend, route.kernel) == (AITER, "flydsl_flash_attn_varlen_bwd (FlyDSL)")
        assert route.contiguous
        return
    assert route.backend == route_backward(AttentionCall(arch, qk, qk, v)).backend
    assert not route.contiguous
    if route.backend == CK:
        assert (qk, v) == (192, 128) and arch is not None


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
        AttentionCall(**values)


# -- tables -------------------------------------------------------------------------------------


def test_route_table_rows_are_json_and_complete():
    rows = route_table(archs=ARCHS, shapes=list(SHAPES.values()), flags=list(FLAGS.values()))
    assert len(rows) == len(SIMULATED_AITERS) * len(ARCHS) * len(SHAPES) * len(FLAGS)
    json.dumps(rows)
    row = rows[0]
    assert (row["aiter"], row["arch"], row["shape"]) == (PYPI, "gfx942", {"qk": 192, "v": 128})
    assert row["backward"] == "ck (mha_bwd)" and row["forward_kernel"] == "CK mha_fwd"


def test_docs_show_the_current_route_tables():
    """docs/mla-ck-backward.md carries both route tables verbatim."""
    doc = (REPO / "docs" / "mla-ck-backward.md").read_text()
    assert format_route_table(route_table()) in doc
    assert format_route_table(route_table(archs=("gfx942",), aiter_gfx="gfx950")) in doc


def test_routing_imports_neither_torch_nor_aiter():
    code = (
        "import sys, titan_rocm.workarounds.mla_ck_backward.routing as r; "
        "r.route_table(); "
        "assert 'torch' not in sys.modules and 'aiter' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith(('torch', 'aiter')))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# -- q/k 128, v 128 (issue 22 item 4: Primus sends it to CK on gfx942, aiter has the kernel) --


@pytest.mark.parametrize("aiter_gfx", [None, "gfx950"], ids=["detected", "misdetected"])
@pytest.mark.parametrize("layout", ["bshd", "thd"])
@pytest.mark.parametrize("version", [PYPI, MAIN, None], ids=["pypi", "main", "unknown"])
def test_qk128_v128_backward_on_gfx942_runs_aiters_fmha_v3(version, layout, aiter_gfx):
    """aiter's gates (can_impl_fmha_v3_bwd's psskddv; the varlen gate's pssk) and gfx942's
    kernel tables take q/k 128, v 128 in 0.1.7.post2 and main: titan-rocm leaves it to aiter's
    ASM kernel, not Primus's CK, and says so."""
    call = AttentionCall("gfx942", 128, 128, 128, layout=layout, aiter_gfx=aiter_gfx,
                         aiter_version=version)
    route = route_backward(call)
    assert route.backend == AITER
    assert route.kernel == ("fmha_v3_varlen_bwd (ASM)" if layout == "thd"
                            else "fmha_v3_bwd (ASM) for seqlen_q > 16, else CK mha_bwd")
    assert "Primus PR #962" in route.reason and "gfx942's fmha_v3 backward has q/k 128" in (
        route.reason)


@pytest.mark.parametrize(
    ("flags", "aiter_gfx", "kernel"),
    [(Flags(dropout_p=0.1), None, "CK mha_bwd"),
     (Flags(has_bias=True), None, "CK mha_bwd"),
     (Flags(has_bias=True, layout="thd"), None, "fmha_v3_varlen_bwd (ASM)"),
     (Flags(deterministic=True), None, "aiter's choice"),
     (Flags(), "gfx90a", "CK mha_bwd")],
)
def test_qk128_v128_backward_where_aiters_gates_refuse(flags, aiter_gfx, kernel):
    call = AttentionCall("gfx942", 128, 128, 128, **dataclasses.asdict(flags),
                         aiter_gfx=aiter_gfx, aiter_version=MAIN)
    route = route_backward(call)
    assert route.backend == AITER and route.kernel == kernel, route.reason


def test_qk128_v128_backward_reads_the_arch_fact(monkeypatch):
    """Take gfx942's fact away: the route no longer claims the ASM kernel."""
    call = AttentionCall("gfx942", 128, 128, 128, aiter_version=MAIN)
    assert route_backward(call).kernel.startswith("fmha_v3_bwd")
    gone = dataclasses.replace(archs.ARCHS["gfx942"], aiter_fmha_v3_bwd_qk128_v128=False)
    monkeypatch.setitem(archs.ARCHS, "gfx942", gone)
    assert route_backward(call).kernel == "aiter's choice"
