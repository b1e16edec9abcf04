"""``titan-rocm plan`` for TorchTitan 0.3.0 jobs (--module/--config), on a machine without a GPU."""

from __future__ import annotations

import json

from titan_rocm.cli import main

ROCM_16B = ["--module", "titan_rocm.torchtitan.configs", "--config", "deepseek_v3_16b"]
COMPILED = ["--compile.enable", "--compile.components", "model,loss"]


def _plan(capsys, *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_shows_moe_blocks_eager_and_the_dense_block_compiled_on_gfx942(capsys):
    plan = _plan(capsys, *ROCM_16B, *COMPILED, "--arch", "gfx942")
    assert plan["torchtitan"] == "0.3.0" and plan["titan_rocm_listed"]
    assert plan["model"] == {"name": "deepseek_v3", "flavor": "16B", "blocks": 27,
                             "moe_blocks": 26, "parallelize_fn":
                             "torchtitan.models.deepseek_v3.parallelize.parallelize_deepseekv3"}
    applied = {d["workaround"]: d["applied"] for d in plan["workarounds"]}
    assert applied == {"precision_casts": True, "triton_war": True, "gemm_lookup": False,
                       "grouped_mm": True, "moe_eager_compile": True,
                       "mla_ck_backward": True, "numerics_audit": False,
                       "divergence_guard": True}
    reasons = {d["workaround"]: d["reason"] for d in plan["workarounds"]}
    assert reasons["gemm_lookup"] == "no table named ([rocm] gemm_lookup_table is empty)"
    blocks = plan["compile"]["blocks"]  # the default scope, "block" (PR #962's validated fix)
    assert blocks["0"].startswith("fullgraph, in place")
    assert blocks["1"] == blocks["26"] == "eager (rocm.moe_eager_compile)"
    details = {d["workaround"]: d for d in plan["workarounds"]}["moe_eager_compile"]["details"]
    assert details["scope"] == "block" and details["cost"].startswith("'block': 0.93 of stock")
    assert "unvalidated on ROCm" in details["other_scope"]
    split = _plan(capsys, *ROCM_16B, *COMPILED, "--arch", "gfx942",
                  "--rocm.moe_eager_scope", "moe")["compile"]["blocks"]
    assert split["1"] == split["26"] == ("attention, attention_norm, ffn_norm fullgraph; "
                                         "moe eager (rocm.moe_eager_compile)")


def test_plan_follows_rocm_flags_and_says_when_titan_rocm_is_not_attached(capsys):
    plan = _plan(capsys, *ROCM_16B, *COMPILED, "--arch", "gfx942",
                 "--rocm.moe_eager_compile", "off", "--rocm.grouped_mm_backend", "loop")
    decisions = {d["workaround"]: d for d in plan["workarounds"]}
    off = 'disabled by [rocm] moe_eager_compile = "off"'
    assert decisions["moe_eager_compile"]["reason"] == off
    assert decisions["grouped_mm"]["details"]["backend"] == "loop"
    assert plan["compile"]["blocks"]["1"].endswith("MoE block included)")
    stock = _plan(capsys, "--module", "deepseek_v3", "--config", "deepseek_v3_debugmodel")
    assert not stock["titan_rocm_listed"]
    assert main(["plan", "--module", "deepseek_v3", "--config", "deepseek_v3_debugmodel"]) == 0
    assert "titan-rocm is not attached to this job" in capsys.readouterr().out


def test_plan_reads_the_override_entry_settings(capsys):
    plan = _plan(capsys, "--module", "deepseek_v3", "--config", "deepseek_v3_debugmodel",
                 "--override.imports",
                 'titan_rocm.torchtitan.override.rocm={"divergence_guard": "off"}')
    assert plan["converters"] == ["--override.imports titan_rocm.torchtitan.override.rocm"]
    assert plan["settings"]["divergence_guard"] == "off"


def test_plan_rejects_a_0_2_2_job_and_a_bad_arch_with_exit_2(capsys):
    assert main(["plan", "--job.config_file", "configs/deepseek_v3_debug.toml"]) == 2
    assert "--job.config_file is TorchTitan 0.2.2's" in capsys.readouterr().err
    assert main(["plan", *ROCM_16B, "--arch", "gfx000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("titan-rocm plan: ") and "gfx000" in err


def test_world_size_is_derived_or_given_as_for_0_2_2(capsys):
    """dp_shard = -1 with EP 8 fits 8 ranks at the least, not the 1 a product of degrees says;
    --nnodes x --nproc-per-node and --world-size are taken, a count below 1 refused."""
    ep8 = [*ROCM_16B, "--arch", "gfx942", "--parallelism.expert_parallel_degree", "8"]
    world = _plan(capsys, *ep8)["world_size"]
    assert (world["size"], world["source"]) == (8, "derived")
    world = _plan(capsys, *ep8, "--nnodes", "2", "--nproc-per-node", "8")["world_size"]
    assert (world["size"], world["source"]) == (16, "--nnodes x --nproc-per-node")
    assert main(["plan", *ep8, "--world-size", "0"]) == 2
    assert "--world-size: '0' is not valid; accepted: an integer >= 1" in capsys.readouterr().err
