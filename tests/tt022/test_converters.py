"""The converter framework: gates, once-only application, logging, post-optimizer hooks."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any, ClassVar

import pytest
import torch.nn as nn
from torchtitan.config import ConfigManager
from torchtitan.protocols.model_converter import build_model_converters

import titan_rocm
from titan_rocm import platform
from titan_rocm.adapters.tt022.converters import RocmConverter, converter_classes
from titan_rocm.adapters.tt022.converters.converter import JOB_ATTR
from titan_rocm.platform import PlatformFacts
from titan_rocm.workarounds.base import Workaround
from titan_rocm.workarounds.registry import WORKAROUNDS, workaround_class

CPU = PlatformFacts(
    torch_version="2.13.0", hip_version=None, cuda_version=None, device_count=0,
    gcn_arch_name=None, device_capability=None, device_name=None, triton_version="3.9.0",
    aiter_spec_found=False, simulated=True,
)


class Recorder(Workaround):
    """A workaround that records what the framework calls."""

    name = "grouped_mm"  # borrows a real mode field of [rocm]
    calls: ClassVar[list[str]] = []

    def check(self, model: nn.Module) -> str | None:
        return None if hasattr(model, "layers") else "model has no layers"

    def apply(self, model: nn.Module) -> None:
        self.calls.append("apply")

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        self.calls.append(f"hook:{len(model_parts)}")

    def plan(self, model: nn.Module) -> dict[str, Any]:
        return {"seen": type(model).__name__}


class Needy(Recorder):
    name = "mla_ck_backward"

    def unmet(self) -> str | None:
        return "needs aiter; aiter is not installed"


def _converter(name: str, classes: list[type[Workaround]]) -> type[RocmConverter]:
    return type(
        "TestConverter",
        (RocmConverter,),
        {
            "converter_name": name,
            "workaround_names": tuple(c.name for c in classes),
            "workaround_classes": classmethod(lambda cls: classes),
        },
    )


class WithLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({"0": nn.Linear(2, 2)})


def _job(*flags: str) -> Any:
    return ConfigManager().parse_args(["--job.custom_config_module", "titan_rocm.config", *flags])


@pytest.fixture(autouse=True)
def _clear() -> None:
    Recorder.calls.clear()


def test_registered_names_follow_torchtitan_dotted_style() -> None:
    titan_rocm.register_converters()
    from torchtitan.protocols.model_converter import _registry_model_converter_cls as registry

    expected = {"rocm"} | {f"rocm.{name}" for name in WORKAROUNDS}
    assert expected <= set(registry)
    assert set(converter_classes()) == expected
    assert converter_classes()["rocm"].workaround_names == tuple(WORKAROUNDS)


def test_auto_skips_off_rocm_with_reason(caplog: pytest.LogCaptureFixture) -> None:
    conv_cls = _converter("rocm.test", [Recorder])
    with platform.override(CPU), caplog.at_level(logging.INFO):
        conv = conv_cls(_job(), None)
        conv.convert(WithLayers())
    assert Recorder.calls == []
    assert conv.decisions[0].reason == "not a ROCm build (torch.version.hip is None)"
    assert "rocm.grouped_mm skipped: not a ROCm build" in caplog.text


def test_on_applies_anywhere_and_forwards_hook() -> None:
    conv = _converter("rocm.test", [Recorder])(_job("--rocm.grouped_mm", "on"), None)
    with platform.override(CPU):
        model = WithLayers()
        conv.convert(model)
        conv.post_optimizer_hook([model, model])
    assert Recorder.calls == ["apply", "hook:2"]
    assert conv.decisions[0].applied and conv.decisions[0].details == {"seen": "WithLayers"}


def test_off_and_precondition_reasons() -> None:
    off = _converter("rocm.test", [Recorder])(_job("--rocm.grouped_mm", "off"), None)
    off.convert(WithLayers())
    assert off.decisions[0].reason == 'disabled by [rocm] grouped_mm = "off"'
    on = _converter("rocm.test", [Recorder])(_job("--rocm.grouped_mm", "on"), None)
    on.convert(nn.Linear(1, 1))
    assert on.decisions[0].reason == "model has no layers"
    assert Recorder.calls == []


def test_umbrella_and_single_apply_once(caplog: pytest.LogCaptureFixture) -> None:
    job = _job("--rocm.grouped_mm", "on")
    umbrella = _converter("rocm", [Recorder])(job, None)
    single = _converter("rocm.grouped_mm", [Recorder])(job, None)
    model = WithLayers()
    with caplog.at_level(logging.INFO):
        umbrella.convert(model)
        single.convert(model)
        umbrella.post_optimizer_hook(model)
        single.post_optimizer_hook(model)
    assert Recorder.calls == ["apply", "hook:1"]
    assert getattr(model, JOB_ATTR).applied_by == {"grouped_mm": "rocm"}
    assert "skipped: already applied by converter 'rocm'" in caplog.text


def test_on_mode_requirements_fail_at_start_up() -> None:
    with pytest.raises(
        ValueError, match='mla_ck_backward = "on" cannot apply: needs aiter; aiter is not'
    ):
        _converter("rocm.test", [Needy])(_job("--rocm.mla_ck_backward", "on"), None)
    # auto never raises for missing requirements: it skips with the same sentence instead.
    with platform.override(PlatformFacts.simulated_rocm("gfx942")):
        conv = _converter("rocm.test", [Needy])(_job(), None)
        conv.convert(WithLayers())
    assert conv.decisions[0].reason == "needs aiter; aiter is not installed"
    assert Recorder.calls == []


def test_unknown_workaround_name() -> None:
    with pytest.raises(ValueError, match="unknown titan-rocm workaround 'nope'; known: "):
        workaround_class("nope")


def test_torchtitan_builds_our_converters_from_its_own_list() -> None:
    job = _job("--model.converters", "rocm.precision_casts", "--compile.enable")
    container = build_model_converters(job, None)
    assert [type(c).converter_name for c in container.converters] == ["rocm.precision_casts"]


PRECISION_SCRIPT = """
import os, sys
import torch._inductor.config as c
from torchtitan.config import ConfigManager
from titan_rocm import platform
from titan_rocm.adapters.tt022.converters import converter_classes
import torch.nn as nn
if sys.argv[1] == "user-false":
    c.emulate_precision_casts = False
job = ConfigManager().parse_args(["--job.custom_config_module", "titan_rocm.config",
                                  "--compile.enable", "--rocm.precision_casts", "on"])
conv = converter_classes()["rocm.precision_casts"](job, None)
conv.convert(nn.Linear(1, 1))
print(c.emulate_precision_casts, conv.decisions[0].applied, conv.decisions[0].reason)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "env", "expected"),
    [
        ("default", {}, "True True "),
        ("user-false", {}, "False False left as the user set it "
         "(torch._inductor.config.emulate_precision_casts = False)"),
        ("default", {"TORCHINDUCTOR_EMULATE_PRECISION_CASTS": "0"},
         "False False left as the user set it (TORCHINDUCTOR_EMULATE_PRECISION_CASTS=0)"),
    ],
)
def test_precision_casts_in_a_fresh_process(case: str, env: dict[str, str], expected: str) -> None:
    import os

    full_env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_EMULATE_PRECISION_CASTS"}
    full_env.update(env)
    # The timeout guards against a hang: on a busy 2-core machine the imports alone took 120 s.
    out = subprocess.run(
        [sys.executable, "-c", PRECISION_SCRIPT, case],
        capture_output=True, text=True, env=full_env, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == expected.strip()


def test_precision_casts_skips_without_compile() -> None:
    conv = converter_classes()["rocm.precision_casts"](_job("--rocm.precision_casts", "on"), None)
    conv.convert(nn.Linear(1, 1))
    assert not conv.decisions[0].applied
    assert "compile disabled" in conv.decisions[0].reason
