"""The aiter probe in titan_rocm.platform: installed version, what get_gfx() answers (asked, or
predicted from GPU_ARCHS as aiter reads it), the API generation; simulated for plans."""

from __future__ import annotations

import dataclasses
import importlib
import sys

import pytest

from titan_rocm import platform
from titan_rocm.platform import (
    AiterFacts,
    PlatformFacts,
    api_generation,
    predicted_aiter_gfx,
    probe_aiter,
)

pytestmark = pytest.mark.usefixtures("clean_mla_state")


@pytest.mark.parametrize(
    ("env", "gfx"),
    [({}, "gfx942"), ({"GPU_ARCHS": "native"}, "gfx942"), ({"GPU_ARCHS": "gfx950"}, "gfx950"),
     ({"GPU_ARCHS": "gfx942;gfx950"}, "gfx950"), ({"GPU_ARCHS": "gfx950;gfx942"}, "gfx942"),
     ({"GPU_ARCHS": ""}, None)],
)
def test_get_gfx_is_predicted_as_aiter_reads_gpu_archs(env, gfx):
    """aiter's get_gfx_custom_op_core: GPU_ARCHS's last entry; rocminfo only for native."""
    got, source = predicted_aiter_gfx("gfx942", env)
    assert got == gfx
    assert ("rocminfo" in source) == (env.get("GPU_ARCHS", "native") == "native")


@pytest.mark.parametrize(
    ("version", "generation"),
    [("0.1.7.post2.dev18", "0.1.7"), ("0.1.5", "0.1.7"), ("0.1.8", "main"),
     ("0.1.20.post1", "main"), ("main", "main"), (None, None), ("weird", None)],
)
def test_api_generation(version, generation):
    assert api_generation(version) == generation


def test_mismatch_and_description():
    facts = AiterFacts("0.1.7.post2.dev18", "gfx950", "last entry of GPU_ARCHS='gfx942;gfx950'")
    assert facts.mismatch("gfx942") and not facts.mismatch("gfx950")
    assert not facts.mismatch(None)
    assert facts.describe() == ("aiter 0.1.7.post2.dev18 (API 0.1.7), get_gfx() gfx950 "
                                "(last entry of GPU_ARCHS='gfx942;gfx950')")


@pytest.mark.parametrize(("choice", "version", "api"), [
    ("0.1.7", "0.1.7.post2.dev18", "0.1.7"), ("e4048607", "main e4048607", "main"),
    ("main", "main", "main")])
def test_simulated_platforms_carry_the_chosen_aiter(choice, version, api, monkeypatch):
    monkeypatch.setenv("GPU_ARCHS", "gfx942;gfx950")
    facts = PlatformFacts.simulated_rocm("gfx942", aiter=choice)
    assert facts.aiter_spec_found and facts.aiter.version == version
    assert facts.aiter.gfx == "gfx950" and facts.aiter.mismatch(facts.gfx_arch)
    assert f"aiter {version} (API {api})" in facts.describe()


def test_simulated_platform_without_aiter():
    facts = PlatformFacts.simulated_rocm("gfx942", aiter="absent")
    assert facts.aiter is None and not facts.aiter_spec_found
    assert "aiter absent" in facts.describe()


def test_bad_simulated_aiter_names_the_value_and_the_choices():
    accepted = "aiter = '0.2' is not valid; accepted: 0.1.7, e4048607, main, absent"
    with pytest.raises(ValueError, match=accepted):
        PlatformFacts.simulated_rocm("gfx942", aiter="0.2")


def test_probe_asks_aiters_own_get_gfx_once_aiter_is_imported(fake_aiter_path, monkeypatch):
    monkeypatch.setenv("GPU_ARCHS", "gfx942;gfx950")
    before = probe_aiter("gfx942")
    assert before.gfx == "gfx950" and before.gfx_source.startswith("last entry of GPU_ARCHS")
    importlib.import_module("aiter.ops.mha")
    sys.modules["aiter.jit.utils.chip_info"].get_gfx()  # aiter caches its first answer
    monkeypatch.setenv("GPU_ARCHS", "gfx942")  # a prediction would now say gfx942
    after = probe_aiter("gfx942")
    assert (after.gfx, after.gfx_source) == ("gfx950", "aiter's get_gfx()")
    assert after.version == sys.modules["aiter"].__version__  # no dist-info: the module's
    assert after.generation == {"0.1.7": "0.1.7"}.get(fake_aiter_path, "main")


def test_no_aiter_installed_probes_to_none(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert probe_aiter("gfx942") is None


def test_reprobe_updates_detected_facts_only(fake_aiter, monkeypatch):
    detected = dataclasses.replace(PlatformFacts.simulated_rocm("gfx942"), simulated=False,
                                   aiter=AiterFacts(None, "gfx942", "stale"))
    monkeypatch.setattr(platform, "_current", detected)
    monkeypatch.setattr(platform, "_overrides", [])
    sys.modules["aiter.jit.utils.chip_info"].get_gfx()
    refreshed = platform.reprobe_aiter()
    assert refreshed.aiter.gfx_source == "aiter's get_gfx()" and platform.current() is refreshed
    simulated = PlatformFacts.simulated_rocm("gfx950")
    with platform.override(simulated):
        assert platform.reprobe_aiter() is simulated
