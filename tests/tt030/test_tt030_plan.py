"""``titan-rocm plan`` for TorchTitan 0.3.0 jobs (--module/--config), on a machine without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
    assert details["scope"] == "block" and details["cost"].startswith("'block': 0.9315 of stock")
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


DEBUG = ["--module", "titan_rocm.torchtitan.configs", "--config", "llama3_debugmodel"]


def test_help_torchtitan_lists_the_jobs_flags_and_a_rejected_flag_points_there(capsys):
    """0.3.0's flags depend on the job's config: --help-torchtitan with --module/--config is
    TorchTitan's own help for that job ([rocm]'s included); a flag TorchTitan rejects names it."""
    assert main(["plan", *DEBUG, "--help-torchtitan"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: titan-rocm plan ") and "--rocm.triton-war {auto,on,off}" in out
    assert main(["plan", "--help-torchtitan"]) == 0  # no job: how to name one
    assert "--module M --config F --help-torchtitan" in capsys.readouterr().out
    assert main(["plan", *DEBUG, "--training.bogus", "1"]) == 2
    err = capsys.readouterr().err
    assert "For full helptext, run titan-rocm plan --help" in err
    assert err.splitlines()[-1] == (
        "titan-rocm plan: TorchTitan rejected the arguments (exit 2; the box above says "
        f"which); titan-rocm plan {' '.join(DEBUG)} --help-torchtitan lists this job's flags")


def test_torchtitans_warnings_are_said_once_after_the_answer(capsys):
    """0.3.0 warns about its own checkpoint default once per config it builds (three times
    while a plan reads a job): said once, after the plan, as TorchTitan's."""
    assert main(["plan", *DEBUG]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("verdict: the job starts")
    said = [line for line in err.splitlines() if "initial_load_model_only" in line]
    assert said == ["TorchTitan warned while titan-rocm plan read the job (its own "
                    "warning, which the job prints at start-up too; the plan goes on "
                    "regardless): initial_load_model_only=True has no effect without an "
                    "initial_load_path."]


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


# -- the degrees against the world size, as 0.2.2's plan checks them (issue 25, item 5) ----------

def test_ep_that_the_world_size_cannot_hold_is_refused_as_in_0_2_2(capsys):
    """deepseek_v3_16b with EP 8 on 3 ranks: 0.3.0's ParallelDims takes it, its build_mesh at
    start-up does not; plan refuses it with the reason, exit 2 (and in JSON)."""
    ep8 = [*ROCM_16B, "--arch", "gfx942", "--parallelism.expert_parallel_degree", "8"]
    assert main(["plan", *ep8, "--world-size", "3"]) == 2
    err = capsys.readouterr().err
    assert ("expert_parallel_degree 8 does not divide dp_shard 3 x cp 1 x tp 1 = 3 on world "
            "size 3 (--world-size), so TorchTitan 0.3.0 cannot build its expert device mesh"
            in err), err
    assert main(["plan", *ep8, "--world-size", "3", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["exit_code"] == 2
    plan = _plan(capsys, *ep8, "--world-size", "16")
    assert plan["world_size"]["size"] == 16
    assert any("batch-size" in c for c in plan["not_checked"])


_MESH_PROBE = """
import json, sys
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchtitan.distributed import ParallelDims
out = []
for world, d in json.load(sys.stdin):
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        ParallelDims(world_size=world, **d).build_mesh()
        out.append(True)
    except (AssertionError, ValueError, RuntimeError):
        out.append(False)
    finally:
        dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_expert_mesh_check_agrees_with_0_3_0s_build_mesh():
    """On 60 random layouts: plan's verdict (ParallelDims + check_expert_mesh) is the real
    0.3.0 build_mesh's on a fake process group of that size."""
    import random

    from torchtitan.distributed import ParallelDims

    from titan_rocm.adapters.common import WorldSize
    from titan_rocm.adapters.tt030.plan import PlanError, check_expert_mesh

    rng = random.Random(25)
    cases = [(rng.choice([1, 2, 3, 4, 6, 8, 12, 16]),
              {"dp_replicate": rng.choice([1, 1, 2]), "dp_shard": rng.choice([-1, 1, 2, 4]),
               "cp": rng.choice([1, 1, 2]), "tp": rng.choice([1, 2, 4]),
               "pp": rng.choice([1, 1, 2]), "ep": rng.choice([1, 2, 4, 8])})
             for _ in range(60)]
    real = subprocess.run([sys.executable, "-c", _MESH_PROBE], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=600, check=True)
    verdicts = json.loads(real.stdout.strip().splitlines()[-1])
    assert any(verdicts) and not all(verdicts)
    for (world, degrees), builds in zip(cases, verdicts, strict=True):
        try:
            dims = ParallelDims(world_size=world, **degrees)
            check_expert_mesh(dims, WorldSize(world, "--world-size", ""))
            ours = True
        except (AssertionError, PlanError):
            ours = False
        assert ours == builds, (world, degrees)


# -- --module / --config read as 0.3.0's ConfigManager reads them (issue 25, item 8) -------------

def test_module_and_config_are_read_as_0_3_0s_config_manager_reads_them(monkeypatch):
    """On every command line of up to 4 such tokens where 0.3.0's ``_load_config`` gets as
    far as importing the module, plan's label (module_and_config) names the same module."""
    import itertools

    from torchtitan.config import manager

    from titan_rocm.adapters.tt022.job_args import module_and_config

    seen: dict[str, str] = {}

    def fake_import(path: str):
        # _load_config imports "<prefix>.<module>.config_registry" next: note it, stop there.
        name = path.removesuffix(".config_registry")
        seen.setdefault("module", name.removeprefix("torchtitan.models."))
        raise ImportError("stop here")

    tokens = ["--module", "--module=llama3", "deepseek_v3", "--config", "--config=a", "b",
              "--x"]
    checked = 0
    for n in range(1, 5):
        for args in itertools.product(tokens, repeat=n):
            seen.clear()
            with monkeypatch.context() as m:
                m.setattr(manager.importlib, "import_module", fake_import)
                try:
                    manager.ConfigManager()._load_config(list(args))
                except (ValueError, ImportError, KeyError):
                    pass
            if "module" not in seen:
                continue
            assert module_and_config(list(args))[0] == seen["module"], args
            checked += 1
    assert checked > 20
