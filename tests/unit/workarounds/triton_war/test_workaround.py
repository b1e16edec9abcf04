"""The ``rocm.triton_war`` workaround (gate, apply, plan, stats hook) and the cache tag."""

from __future__ import annotations

import json
import logging
import os
import sys
from types import ModuleType

import pytest

pytest.importorskip("torchtitan")
torch = pytest.importorskip("torch")

from titan_rocm.platform import PlatformFacts  # noqa: E402
from titan_rocm.scanner.names import WORKER_ENV  # noqa: E402
from titan_rocm.settings import RocmSettings  # noqa: E402
from titan_rocm.workarounds.base import Context, planning  # noqa: E402
from titan_rocm.workarounds.triton_war import (  # noqa: E402
    bootstrap,
    cache_tag,
    compile_hook,
    stats,
    workaround,
)
from titan_rocm.workarounds.triton_war.workaround import TritonWar  # noqa: E402

_ENV_KEYS = ("PYTHONPATH", "TORCH_CUSTOM_PYTHONPATH", cache_tag.CACHE_KEY_TAG_ENV, *WORKER_ENV)


@pytest.fixture(autouse=True)
def restore_process_state(tmp_path, monkeypatch):
    """apply() changes process-wide state on purpose; put it all back."""
    import torch.compiler.config as compiler_config

    saved_env = {k: os.environ.get(k) for k in _ENV_KEYS}
    saved_path = list(sys.path)
    saved_tag = compiler_config.cache_key_tag
    monkeypatch.setenv(bootstrap.ENV_STATS_DIR, str(tmp_path / "stats"))
    stats.reset_local()
    yield
    compile_hook.uninstall()
    stats.reset_local()
    compiler_config.cache_key_tag = saved_tag
    sys.path[:] = saved_path
    for key, value in saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def make(arch: str | None = "gfx942", mode: str = "auto", **settings):
    if arch is None:
        facts = PlatformFacts(None, None, None, 0, None, None, None, "3.9.0", False)
    else:
        facts = PlatformFacts.simulated_rocm(arch)
    ctx = Context(settings=RocmSettings(triton_war=mode, **settings), platform=facts)
    return TritonWar(ctx)


def rocm_without_facts(gfx: str) -> PlatformFacts:
    """A ROCm machine whose device titan-rocm has no facts about (``gcnArchName`` ``gfx``)."""
    return PlatformFacts("2.13.0", "7.1", None, 1, f"{gfx}:sramecc+:xnack-", None, None,
                         "3.9.0", False)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "gfx90a", "gfx1250"])
def test_auto_applies_on_every_rocm_arch(arch):
    # No architecture allowlist (AMD-AGI/Primus _on_rocm()): known archs, and those without
    # hazard-window facts, all get the WAR under auto.
    war = make(arch)
    assert war.gate(None) is None
    assert war.rule == ("precise" if arch in ("gfx942", "gfx950") else "conservative")


def test_auto_off_rocm_skips_with_the_base_reason():
    assert "not a ROCm build" in make(None).gate(None)


def test_unknown_arch_applies_with_the_conservative_rule_and_says_so_once(caplog, monkeypatch):
    from titan_rocm import log as log_module

    monkeypatch.setattr(log_module, "_seen", set())
    ctx = Context(settings=RocmSettings(), platform=rocm_without_facts("gfx1100"))
    war = TritonWar(ctx)
    assert war.gate(None) is None  # applies: an unknown arch is not skipped
    assert war.rule == "conservative"
    with caplog.at_level(logging.WARNING, logger="titan_rocm"), planning():
        war.apply(None)
        TritonWar(ctx).apply(None)  # a second job in the process: no second line
    lines = [r.getMessage() for r in caplog.records if "hazard-window facts" in r.getMessage()]
    assert lines == ["titan-rocm: titan-rocm has no hazard-window facts for GPU architecture "
                     "gfx1100: scanning with the conservative rule instead of [rocm] "
                     "triton_war_rule = 'precise'"]
    assert war.plan(None)["rule"] == "conservative" and "gfx1100" in war.plan(None)["rule_note"]


def test_known_arch_keeps_the_configured_rule_and_logs_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="titan_rocm"), planning():
        make("gfx942").apply(None)
    assert not [r for r in caplog.records if "hazard-window" in r.getMessage()]
    assert "rule_note" not in make("gfx942").plan(None)


def test_check_and_require_without_triton(monkeypatch):
    monkeypatch.setattr(workaround, "_triton_missing", lambda: True)
    assert "Triton is not installed" in make("gfx942").gate(None)
    with pytest.raises(ValueError, match='triton_war = "on" cannot apply: Triton is not installed'):
        make("gfx942", mode="on").require()


def test_apply_installs_wrapper_exports_env_and_tags_caches(tmp_path):
    import torch.compiler.config as compiler_config

    compiler_config.cache_key_tag = "user-tag"
    w = make("gfx942", triton_war_rule="conservative", triton_war_strict=True)
    w.apply(None)
    hook = compile_hook.installed()
    assert hook is not None and hook.config.rule == "conservative" and hook.config.strict
    assert all(compile_hook.bound_sites().values())
    assert os.environ[bootstrap.ENV_ENABLE] == "1"
    assert os.environ[bootstrap.ENV_RULE] == "conservative"
    assert os.environ[bootstrap.ENV_STRICT] == "1"
    assert sys.path[0] == bootstrap.boot_dir()
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == bootstrap.boot_dir()
    expected_tag = "user-tag+titan-rocm-triton-war-v1-conservative"
    assert compiler_config.cache_key_tag == expected_tag
    assert os.environ[cache_tag.CACHE_KEY_TAG_ENV] == expected_tag
    plan = w.plan(None)
    json.dumps(plan)  # JSON-able
    assert plan["rule"] == "conservative"
    assert plan["buffer_ops_knob"]["knob"] == "triton.knobs.amd.use_buffer_ops"
    assert plan["buffer_ops_knob"]["default"] is True
    assert plan["cache_key_tag"] == expected_tag
    assert plan["stats"]["compiled"] == 0
    assert "sitecustomize" in plan["worker_reach"]


def test_apply_restarts_a_running_compile_worker_pool(monkeypatch):
    shut = []
    fake = ModuleType("torch._inductor.async_compile")
    fake._pool_set = {"pool"}
    fake.shutdown_compile_workers = lambda: shut.append(True)
    monkeypatch.setitem(sys.modules, "torch._inductor.async_compile", fake)
    w = make("gfx942")
    w.apply(None)
    assert shut == [True] and w.plan(None)["compile_workers_restarted"] is True


def test_plan_dry_run_changes_nothing():
    before = dict(os.environ)
    w = make("gfx942")
    with planning():
        w.apply(None)
    assert compile_hook.installed() is None
    assert dict(os.environ) == before
    plan = w.plan(None)
    assert "dry_run" in plan and "stats" not in plan


def test_post_optimizer_hook_reports_worker_residuals_once(tmp_path, caplog):
    w = make("gfx942")
    w.apply(None)
    stats_dir = os.environ[bootstrap.ENV_STATS_DIR]
    with open(os.path.join(stats_dir, "worker-1.jsonl"), "w") as f:
        f.write(json.dumps({"outcome": "residual", "kernel": "triton_poi_fused_silu_0"}) + "\n")
    with caplog.at_level(logging.INFO):
        w.post_optimizer_hook([])
        w._next_stats = 0.5  # pretend the throttle interval passed
        w.post_optimizer_hook([])
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "triton_poi_fused_silu_0" in errors[0].getMessage()
    assert any("1 residual" in r.getMessage() for r in caplog.records)


def test_cache_tag_combine_keeps_user_tag_and_replaces_older_own():
    assert cache_tag.combine("", "precise") == "titan-rocm-triton-war-v1-precise"
    assert cache_tag.combine("mine", "precise") == "mine+titan-rocm-triton-war-v1-precise"
    once = cache_tag.combine("mine", "precise")
    assert cache_tag.combine(once, "precise") == once
    assert cache_tag.combine(once, "conservative") == "mine+titan-rocm-triton-war-v1-conservative"
    assert cache_tag.combine("mine+titan-rocm-triton-war-v0-precise", "precise") == once


def test_cache_tag_changes_inductor_fx_graph_cache_key():
    """Cached graphs built before the wrapper (or with another rule) are not served."""
    import torch.compiler.config as compiler_config
    from torch._inductor.codecache import compiled_fx_graph_hash

    class AddOne(torch.nn.Module):
        def forward(self, x):
            return x + 1

    gm = torch.fx.symbolic_trace(AddOne())

    def key() -> str:
        return compiled_fx_graph_hash(gm, [torch.zeros(2)], {}, [])[0]

    compiler_config.cache_key_tag = ""
    untagged = key()
    precise = cache_tag.apply("precise")
    precise_key = key()
    assert compiler_config.cache_key_tag == precise == os.environ[cache_tag.CACHE_KEY_TAG_ENV]
    cache_tag.apply("conservative")
    assert len({untagged, precise_key, key()}) == 3
