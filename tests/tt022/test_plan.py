"""titan-rocm plan on the shipped configs and on stock TorchTitan 0.2.2 jobs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from titan_rocm.adapters.meta import on_meta
from titan_rocm.adapters.tt022.plan import PlanError, build_meta_model, make_plan
from titan_rocm.cli import main
from titan_rocm.workarounds.registry import WORKAROUNDS as REGISTERED

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.toml"))
WORKAROUNDS = set(REGISTERED)


@pytest.fixture(autouse=True)
def _no_gpu_archs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A simulated aiter reads GPU_ARCHS as the real one would: plans here assume it unset.

    A plan in this process binds the grouped-MM function and replaces apply_compile in
    TorchTitan's modules (as it would in the process it plans for): undo that afterwards, so
    tests that compile a model later see stock TorchTitan.
    """
    from tests.support.moe_test_models import clean_patches

    monkeypatch.delenv("GPU_ARCHS", raising=False)
    with clean_patches():
        yield


def _by_name(plan: dict) -> dict[str, dict]:
    return {d["workaround"]: d for d in plan["workarounds"]}


def test_a_plan_in_process_leaves_no_patch_behind() -> None:
    """A dry run is closed like a job: its workarounds' patches (precision_casts' Inductor
    setting, the guard's wrappers) are put back, so later code in the process sees stock."""
    import torch._inductor.config as inductor_config

    from titan_rocm import patches

    before = [(p.where, p.by) for p in patches.installed()]
    casts = inductor_config.emulate_precision_casts
    plan = make_plan(["--job.config_file", str(REPO / "configs" / "deepseek_v3_16b_bf16.toml")],
                     arch="gfx942")
    assert _by_name(plan)["precision_casts"]["applied"]
    assert [(p.where, p.by) for p in patches.installed()] == before
    assert inductor_config.emulate_precision_casts is casts


def test_configs_exist() -> None:
    names = {p.stem for p in CONFIGS}
    assert {"llama3_8b_bf16", "qwen3_32b_bf16", "deepseek_v3_16b_bf16",
            "deepseek_v3_16b_fp8"} <= names
    assert any("debug" in n for n in names)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_plan_every_shipped_config_on_gfx942(config: Path) -> None:
    plan = make_plan(["--job.config_file", str(config)], arch="gfx942")
    decisions = _by_name(plan)
    assert set(decisions) == WORKAROUNDS  # each reported exactly once
    assert plan["platform"]["arch"] == "gfx942" and plan["platform"]["simulated"]
    assert decisions["precision_casts"]["applied"]
    assert decisions["divergence_guard"]["applied"]
    assert decisions["triton_war"]["applied"]  # gfx942 has the buffer-store hazard
    blocks = plan["compile"]["blocks"]
    assert len(blocks) == plan["model"]["blocks"]
    if plan["model"]["moe_blocks"]:
        assert decisions["moe_eager_compile"]["applied"]
        # The default scope ("block", PR #962's validated fix): every MoE block eager whole.
        assert sum(v == "eager (MoE)" for v in blocks.values()) == plan["model"]["moe_blocks"]
        details = decisions["moe_eager_compile"]["details"]
        assert details["scope"] == "block" and "0.9315 of stock" in details["cost"]
        assert details["other_scope"].startswith("'moe': 0.9656 of stock")
        assert "unvalidated on ROCm" in details["other_scope"]
        assert decisions["grouped_mm"]["applied"]
    else:
        assert decisions["moe_eager_compile"]["reason"] == "model has no MoE blocks"
        assert set(blocks.values()) == {"fullgraph"}
    mla = decisions["mla_ck_backward"]
    if plan["model"]["name"] != "deepseek_v3":
        assert not mla["applied"] and "DeepSeek" in mla["reason"]
    elif "16b" in config.stem:
        # TorchTitan's 16B flavor uses FlexAttention with block_causal (document) masks:
        # aiter's varlen attention within each document.
        assert mla["applied"] and mla["details"]["attention"].startswith("varlen")
        assert mla["details"]["backward"] == "ck (mha_varlen_bwd)"
    else:
        assert mla["applied"]


def test_plan_route_differs_per_arch() -> None:
    config = str(REPO / "configs" / "deepseek_v3_debug.toml")
    mi300 = _by_name(make_plan(["--job.config_file", config], arch="gfx942"))
    mi355 = _by_name(make_plan(["--job.config_file", config], arch="gfx950"))
    assert mi300["mla_ck_backward"]["details"]["backward"].startswith("ck")
    assert not mi355["mla_ck_backward"]["details"]["backward"].startswith("ck")


# Stock TorchTitan 0.2.2 jobs as a user's own TOML has them (model, flavor and the
# parallelism of TorchTitan's train_configs/<file> at v0.2.2), with no titan-rocm line:
# plan adds the converter on the command line, under each launcher.
STOCK_JOBS = {
    "llama3 debug": ("llama3", "debugmodel", {}),
    "llama3 8B": ("llama3", "8B", {}),
    "qwen3 MoE debug": ("qwen3", "debugmodel_moe", {}),
    "qwen3 32B": ("qwen3", "32B", {}),
    "deepseek_v3 debug": ("deepseek_v3", "debugmodel", {}),
    "deepseek_v3 16B": ("deepseek_v3", "16B", {"expert_parallel_degree": 8}),
    "llama4 debug": ("llama4", "debugmodel", {}),
}


def stock_job(tmp_path: Path, job: str) -> Path:
    name, flavor, parallelism = STOCK_JOBS[job]
    lines = ["[model]", f'name = "{name}"', f'flavor = "{flavor}"', "[parallelism]",
             "data_parallel_shard_degree = -1"]
    lines += [f"{key} = {value}" for key, value in parallelism.items()]
    path = tmp_path / f"{job.replace(' ', '_')}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("launcher", ["torchtitan", "titan-rocm"])
@pytest.mark.parametrize("job", STOCK_JOBS)
def test_plan_stock_jobs_with_the_converter_added(tmp_path: Path, job: str, launcher: str) -> None:
    args = ["--job.config_file", str(stock_job(tmp_path, job)), "--model.converters", "rocm",
            "--compile.enable"]
    if launcher == "torchtitan":  # the two lines the TOML would carry
        args += ["--experimental.custom_import", "titan_rocm"]
    plan = make_plan(args, arch="gfx942", launcher=launcher)
    assert plan["titan_rocm_listed"] and plan["launcher"] == launcher
    assert set(_by_name(plan)) == WORKAROUNDS
    assert plan["world_size"]["source"] == "derived"


def test_plan_off_rocm_skips_with_reasons(tmp_path: Path) -> None:
    from titan_rocm import platform
    from titan_rocm.platform import PlatformFacts

    cpu = PlatformFacts("2.13.0", None, None, 0, None, None, None, "3.9.0", False)
    with platform.override(cpu):
        plan = make_plan(["--job.config_file", str(stock_job(tmp_path, "llama3 debug")),
                          "--model.converters", "rocm", "--compile.enable"],
                         launcher="titan-rocm")
    decisions = _by_name(plan)
    for name in WORKAROUNDS - {"divergence_guard"}:
        assert not decisions[name]["applied"], name
        assert decisions[name]["reason"]
    assert decisions["divergence_guard"]["applied"]  # on every platform by default


def test_plan_cli_text_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       caplog: pytest.LogCaptureFixture) -> None:
    cfg = str(stock_job(tmp_path, "deepseek_v3 debug"))
    assert main(["plan", "--arch", "gfx942", "--launcher", "titan-rocm", "--job.config_file",
                 cfg, "--model.converters", "rocm", "--compile.enable", "--rocm.triton_war",
                 "off", "--rocm.moe_eager_scope", "block"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "layers.1–5: eager (MoE)" in text and "layers.0: fullgraph" in text
    # This CPU lacks SM90; the simulated gfx942 does not: no warning about grouped MM.
    assert not any("Failed to use grouped mm" in r.getMessage() for r in caplog.records)
    assert 'rocm.triton_war' in text and 'disabled by [rocm] triton_war = "off"' in text
    assert main(["plan", "--json", "--job.config_file", cfg]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["titan_rocm_listed"] is False and plan["workarounds"] == []
    assert main(["plan", "--arch", "gfx9000", "--job.config_file", cfg]) == 2
    assert "unknown AMD GPU architecture 'gfx9000'" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[rocm]\ngrouped_mm = "sometimes"\n')
    for launcher in ("torchtitan", "titan-rocm"):
        flags = [] if launcher == "titan-rocm" else ["--job.custom_config_module",
                                                     "titan_rocm.config"]
        assert main(["plan", "--launcher", launcher, "--job.config_file", str(bad), *flags]) == 2
        err = capsys.readouterr().err
        assert "grouped_mm" in err and "sometimes" in err and "auto, on, off" in err


def test_torchtitans_warnings_come_after_the_answer_once_and_say_whose(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """TorchTitan warns about a missing HF assets path while plan reads the job (the path may
    exist on the cluster only): kept, once, after the plan, saying it is TorchTitan's and that
    the plan goes on; a titan-rocm warning in the same plan is printed as before."""
    from titan_rocm.log import forget

    forget("triton_war.")  # logged once per process: an earlier job in this one may have said it
    assert main(["plan", "--job.config_file", str(REPO / "configs" / "llama3_debug.toml"),
                 "--arch", "gfx90a", "--model.hf_assets_path", "/nowhere/hf"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("verdict: the job starts")
    said = [line for line in err.splitlines() if "/nowhere/hf" in line]
    assert said == ["TorchTitan warned while titan-rocm plan read the job (its own "
                    "warning, which the job prints at start-up too; the plan goes on "
                    "regardless): HF assets path /nowhere/hf does not exist!"]
    # titan-rocm's own warning still reaches the handlers there are (here pytest's)
    assert any("no hazard-window facts for GPU architecture gfx90a" in r.getMessage()
               for r in caplog.records)


def test_plan_rejects_unknown_flavor(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no flavor 'huge'; accepted: "):
        make_plan(["--job.config_file", str(stock_job(tmp_path, "llama3 debug")),
                   "--model.flavor", "huge"])


CK_VARLEN_BACKWARD = ("ck (mha_varlen_bwd)", "CK mha_varlen_bwd")


@pytest.mark.parametrize(
    ("aiter", "forward_runs", "backward", "release_facts"),
    [("0.1.7", "CK mha_varlen_fwd", CK_VARLEN_BACKWARD, "0.1.7"),
     ("e4048607", "fmha_v3_varlen_fwd (ASM)", CK_VARLEN_BACKWARD, "0.1.16+"),
     # ROCm/aiter#4875: aiter's own varlen backward runs its FlyDSL kernel on gfx942.
     ("main", "fmha_v3_varlen_fwd (ASM)",
      ("aiter (_flash_attn_varlen_backward)", "flydsl_flash_attn_varlen_bwd (FlyDSL)"),
      "main with #4875"),
     (None, "CK mha_varlen_fwd", CK_VARLEN_BACKWARD, "0.1.7")],  # default: PyPI
)
def test_plan_16b_shows_the_routes_a_user_of_each_aiter_gets(aiter, forward_runs, backward,
                                                              release_facts, capsys):
    cfg = str(REPO / "configs" / "deepseek_v3_16b_bf16.toml")
    flags = ["--aiter", aiter] if aiter else []
    assert main(["plan", "--arch", "gfx942", *flags, "--job.config_file", cfg, "--json"]) == 0
    mla = _by_name(json.loads(capsys.readouterr().out))["mla_ck_backward"]
    details = mla["details"]
    assert mla["applied"] and details["modules"] == 27
    assert details["forward_runs"] == forward_runs
    assert (details["backward"], details["backward_runs"]) == backward
    assert details["aiter"]["api"] == ("0.1.7" if aiter in ("0.1.7", None) else "main")
    assert details["aiter"]["release_facts"] == release_facts
    assert details["aiter"]["markers"] == (["#4875"] if aiter == "main" else "none")


def test_plan_without_aiter_skips_mla_and_shows_no_routes(capsys):
    cfg = str(REPO / "configs" / "deepseek_v3_16b_bf16.toml")
    assert main(["plan", "--arch", "gfx942", "--aiter", "absent", "--job.config_file", cfg]) == 0
    out = capsys.readouterr().out
    assert "rocm.mla_ck_backward    skipped: aiter not usable: missing the aiter package" in out
    assert "aiter: absent" in out and "backward_runs" not in out


def test_plan_aiter_needs_arch_and_a_known_choice(capsys):
    cfg = str(REPO / "configs" / "deepseek_v3_debug.toml")
    assert main(["plan", "--aiter", "main", "--job.config_file", cfg]) == 2
    assert "--aiter main describes a simulated machine; give --arch too" in (
        capsys.readouterr().err)
    assert main(["plan", "--arch", "gfx942", "--aiter", "0.2", "--job.config_file", cfg]) == 2
    assert "invalid choice: '0.2'" in capsys.readouterr().err


def test_docs_show_the_current_16b_plan() -> None:
    """docs/mla-ck-backward.md carries the plan's mla_ck_backward entry for the 16B config
    (--arch gfx942 --aiter 0.1.7) verbatim."""
    from titan_rocm.adapters.tt022.plan import format_plan

    cfg = str(REPO / "configs" / "deepseek_v3_16b_bf16.toml")
    text = format_plan(make_plan(["--job.config_file", cfg], arch="gfx942", aiter="0.1.7"),
                       verbose=True)
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("  rocm.mla_ck_backward "))
    end = next(i for i, x in enumerate(lines) if "guard_not_covered:" in x)
    entry = "\n".join(lines[start:end + 1])
    assert entry in (REPO / "docs" / "mla-ck-backward.md").read_text()


def test_plan_shows_the_moe_scope_per_block(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(Path(__file__).resolve().parents[2] / "configs" / "deepseek_v3_debug.toml")
    assert main(["plan", "--arch", "gfx942", "--job.config_file", cfg,
                 "--rocm.moe_eager_scope", "moe"]) == 0
    text = capsys.readouterr().out
    assert "layers.0: fullgraph" in text
    assert "layers.1–5: attention, attention_norm, ffn_norm fullgraph; moe eager" in text
    assert "      scope: moe" in text
    assert "keeps each MoE module eager" in text  # the experts runner's line agrees
    assert main(["plan", "--arch", "gfx942", "--job.config_file", cfg,
                 "--rocm.moe_eager_scope", "layer"]) == 2
    err = capsys.readouterr().err
    assert "moe-eager-scope" in err and "'block', 'moe'" in err, err  # tyro names both


# -- the plan says only what is true (issue 17, item 8) -------------------------------------------

def _text(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["plan", "--arch", "gfx942", *flags]) == 0
    return capsys.readouterr().out


def _entry(text: str, workaround: str) -> str:
    """The lines of one workaround in the text plan: its status line and its details."""
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"  rocm.{workaround} "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("      ")),
               len(lines))
    return "\n".join(lines[start:end])


@pytest.mark.parametrize(
    ("config", "flags", "workaround", "absent"),
    [
        ("llama3_debug", (), "grouped_mm", "experts_compile:"),  # dense: nothing to bind
        ("deepseek_v3_debug", ("--rocm.mla_ck_backward", "off"), "mla_ck_backward", "backward:"),
        ("deepseek_v3_debug", ("--rocm.grouped_mm", "off"), "grouped_mm", "experts_compile:"),
        ("deepseek_v3_debug", ("--rocm.moe_eager_compile", "off"), "moe_eager_compile",
         "scope:"),
    ],
)
def test_a_skipped_workaround_describes_no_effects(capsys, config, flags, workaround, absent):
    text = _text(capsys, "--job.config_file", str(REPO / "configs" / f"{config}.toml"), *flags)
    status, *details = _entry(text, workaround).splitlines()
    assert "skipped:" in status and not any(absent in line for line in details), details


def test_compile_section_follows_the_models_own_parallelize_fn(capsys):
    cfg = str(REPO / "configs" / "llama3_debug.toml")
    text = _text(capsys, "--job.config_file", cfg, "--model.name", "gpt_oss",
                 "--model.flavor", "debugmodel")
    assert re.search(r"layers\.0–\d+: not compiled", text) and "stock MoE compile" not in text
    assert "summary: no block is compiled: this model's parallelize_fn compiles none" in text


@pytest.mark.parametrize(
    ("scope", "says"),
    [("block", "48 MoE blocks run eager whole; nothing is compiled per block"),
     ("moe", "48 MoE blocks: attention and norms compiled, the MoE module eager")],
)
def test_an_all_moe_model_gets_a_summary_with_its_cost(capsys, scope, says):
    cfg = str(REPO / "configs" / "qwen3_moe_debug.toml")
    text = _text(capsys, "--job.config_file", cfg, "--model.flavor", "30B-A3B",
                 "--rocm.moe_eager_scope", scope, "--world-size", "8")
    summary = next(x for x in text.splitlines() if x.startswith("  summary:"))
    assert "0 of 48 blocks compiled whole" in summary and says in summary
    assert "x stock tokens/s" in summary and "2026-11-30-h200-d/tp-moe-scope" in summary


@pytest.mark.parametrize(("given", "backend"), [("present", "primus_turbo"), ("absent", "torch")])
def test_primus_turbo_can_be_simulated(capsys, given, backend):
    cfg = str(REPO / "configs" / "deepseek_v3_debug.toml")
    text = _text(capsys, "--primus-turbo", given, "--job.config_file", cfg)
    assert f"      backend: {backend}\n" in _entry(text, "grouped_mm")
    assert main(["plan", "--primus-turbo", given, "--job.config_file", cfg]) == 2
    assert f"--primus-turbo {given} describes a simulated machine; give --arch too" in (
        capsys.readouterr().err)


@pytest.mark.parametrize(
    ("aiter", "attention", "backward", "runs"),
    [("0.1.7", "causal", "aiter (_flash_attn_backward)",
      "fmha_v3_bwd (ASM) for seqlen_q > 16, else CK mha_bwd"),
     ("main", "causal", "aiter (_flash_attn_backward)",
      "fmha_v3_bwd (ASM) for seqlen_q > 16, else CK mha_bwd"),
     ("0.1.7", "block_causal", "aiter (_flash_attn_varlen_backward)",
      "fmha_v3_varlen_bwd (ASM)"),
     ("main", "block_causal", "aiter (_flash_attn_varlen_backward)",
      "fmha_v3_varlen_bwd (ASM)")],
)
def test_plan_shows_the_qk128_v128_backward_route_on_gfx942(monkeypatch, capsys, aiter,
                                                             attention, backward, runs):
    """A DeepSeek flavor with q/k 128 (nope 64 + rope 64), v 128: the plan names aiter's
    fmha_v3 kernel for the backward and says why titan-rocm does not follow Primus's CK."""
    import dataclasses

    import torchtitan.models.deepseek_v3 as deepseek

    args = deepseek.deepseekv3_args["debugmodel"]
    monkeypatch.setitem(deepseek.deepseekv3_args, "debugmodel", dataclasses.replace(
        args, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=128,
        attn_type="flex" if attention == "block_causal" else "sdpa", attn_mask_type=attention))
    cfg = str(REPO / "configs" / "deepseek_v3_debug.toml")
    assert main(["plan", "--arch", "gfx942", "--aiter", aiter, "--job.config_file", cfg,
                 "--json"]) == 0
    details = _by_name(json.loads(capsys.readouterr().out))["mla_ck_backward"]["details"]
    assert details["shape"] == {"qk": 128, "v": 128}
    assert (details["backward"], details["backward_runs"]) == (backward, runs)
    assert "Primus PR #962" in details["backward_reason"]


@pytest.mark.parametrize(("dtype", "expected"), [("bfloat16", "torch.bfloat16"),
                                                  ("float32", "torch.float32")])
def test_the_meta_model_is_built_on_meta_at_the_training_dtype(dtype: str, expected: str) -> None:
    """One meta-device build for both generations (titan_rocm.adapters.meta); 0.2.2's
    build_meta_model goes through it."""
    import torch.nn as nn

    layer = on_meta(lambda: nn.Linear(4, 4), dtype)
    assert layer.weight.is_meta and str(layer.weight.dtype) == expected
    from torchtitan.config import ConfigManager

    import titan_rocm

    job = ConfigManager().parse_args([
        "--job.custom_config_module", "titan_rocm.config", "--model.name", "llama3",
        "--model.flavor", "debugmodel", "--training.dtype", dtype])
    model, _ = build_meta_model(job, titan_rocm.platform.PlatformFacts.simulated_rocm("gfx942"))
    assert all(p.is_meta for p in model.parameters())
    assert {str(p.dtype) for p in model.parameters()} == {expected}


def test_a_workaround_listed_twice_is_a_change_and_not_left_as_stock(capsys) -> None:
    text = _text(capsys, "--job.config_file", "configs/llama3_debug.toml",
                 "--model.converters", "rocm,rocm.divergence_guard")
    stock = next(line for line in text.splitlines() if line.startswith("left as stock: "))
    assert "  rocm.divergence_guard: stops at the first non-finite loss" in text
    assert "rocm.divergence_guard" not in stock, stock
    assert "rocm.numerics_audit (" in stock  # the others still are
