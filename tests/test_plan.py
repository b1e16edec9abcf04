"""titan-rocm plan on the shipped configs and on TorchTitan v0.2.2's own configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from titan_rocm.cli import main
from titan_rocm.plan import PlanError, make_plan

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs").glob("*.toml"))
WORKAROUNDS = {"precision_casts", "triton_war", "gemm_lookup", "grouped_mm",
               "moe_eager_compile", "mla_ck_backward", "divergence_guard"}


def _by_name(plan: dict) -> dict[str, dict]:
    return {d["workaround"]: d for d in plan["workarounds"]}


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
        assert sum(v.startswith("eager") for v in blocks.values()) == plan["model"]["moe_blocks"]
        assert decisions["grouped_mm"]["applied"]
    else:
        assert decisions["moe_eager_compile"]["reason"] == "model has no MoE blocks"
        assert set(blocks.values()) == {"fullgraph"}
    mla = decisions["mla_ck_backward"]
    if plan["model"]["name"] != "deepseek_v3":
        assert not mla["applied"] and "DeepSeek" in mla["reason"]
    elif "16b" in config.stem:
        # TorchTitan's 16B flavor uses FlexAttention with block_causal (document) masks,
        # which aiter's dense kernel cannot express: skipped, and said so.
        assert not mla["applied"] and "FlexAttention" in mla["reason"]
    else:
        assert mla["applied"]


def test_plan_route_differs_per_arch() -> None:
    config = str(REPO / "configs" / "deepseek_v3_debug.toml")
    mi300 = _by_name(make_plan(["--job.config_file", config], arch="gfx942"))
    mi355 = _by_name(make_plan(["--job.config_file", config], arch="gfx950"))
    assert mi300["mla_ck_backward"]["details"]["backward"].startswith("ck")
    assert not mi355["mla_ck_backward"]["details"]["backward"].startswith("ck")


REFERENCE = ["llama3__debug_model.toml", "llama3__llama3_8b.toml", "qwen3__qwen3_moe_debug.toml",
             "qwen3__qwen3_32b.toml", "deepseek_v3__debug_model.toml",
             "deepseek_v3__deepseek_v3_16b.toml", "llama4__debug_model.toml"]


@pytest.mark.parametrize("name", REFERENCE)
def test_plan_reference_configs_with_converter_added(reference_configs: Path, name: str) -> None:
    plan = make_plan(
        ["--job.config_file", str(reference_configs / name), "--model.converters", "rocm",
         "--compile.enable"],
        arch="gfx942",
    )
    assert plan["titan_rocm_listed"]
    assert set(_by_name(plan)) == WORKAROUNDS


def test_plan_off_rocm_skips_with_reasons(reference_configs: Path) -> None:
    from titan_rocm import platform
    from titan_rocm.platform import PlatformFacts

    cpu = PlatformFacts("2.13.0", None, None, 0, None, None, None, "3.9.0", False)
    with platform.override(cpu):
        plan = make_plan(["--job.config_file", str(reference_configs / "llama3__debug_model.toml"),
                          "--model.converters", "rocm", "--compile.enable"])
    decisions = _by_name(plan)
    for name in WORKAROUNDS - {"divergence_guard"}:
        assert not decisions[name]["applied"], name
        assert decisions[name]["reason"]
    assert decisions["divergence_guard"]["applied"]  # on every platform by default


def test_plan_cli_text_json_and_errors(reference_configs: Path, capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = str(reference_configs / "deepseek_v3__debug_model.toml")
    assert main(["plan", "--arch", "gfx942", "--job.config_file", cfg, "--model.converters",
                 "rocm", "--compile.enable", "--rocm.triton_war", "off"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "layers.1: eager (MoE)" in text and "layers.0: fullgraph" in text
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
    assert main(["plan", "--job.config_file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "grouped_mm" in err and "sometimes" in err and "auto, on, off" in err


def test_plan_rejects_unknown_flavor(reference_configs: Path) -> None:
    with pytest.raises(PlanError, match="no flavor 'huge'; accepted: "):
        make_plan(["--job.config_file", str(reference_configs / "llama3__debug_model.toml"),
                   "--model.flavor", "huge"])


def test_plan_shows_the_moe_scope_per_block(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(Path(__file__).resolve().parents[1] / "configs" / "deepseek_v3_debug.toml")
    assert main(["plan", "--arch", "gfx942", "--job.config_file", cfg,
                 "--rocm.moe_eager_scope", "moe"]) == 0
    text = capsys.readouterr().out
    assert "layers.0: fullgraph" in text
    assert "layers.5: attention, attention_norm, ffn_norm fullgraph; moe eager" in text
    assert "      scope: moe" in text
    assert "keeps each MoE module eager" in text  # the experts runner's line agrees
    assert main(["plan", "--arch", "gfx942", "--job.config_file", cfg,
                 "--rocm.moe_eager_scope", "layer"]) == 2
    err = capsys.readouterr().err
    assert "moe-eager-scope" in err and "'block', 'moe'" in err, err  # tyro names both
