"""The TorchTitan 0.3.0 adapter: ``rocm(cfg)``, ``RocmTrainer``, the ``--module`` CLI, and
the workarounds at 0.3.0's seams in the real trainer on CPU."""

from __future__ import annotations

import dataclasses
import math

import pytest


def _llama3():
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    return llama3_debugmodel()


def _deepseek():
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel

    return deepseek_v3_debugmodel()


# -- rocm(cfg) and the trainer classes ---------------------------------------------------------

def test_rocm_returns_a_config_of_rocm_trainer_keeping_every_field():
    from torchtitan.trainer import Trainer

    from titan_rocm.adapters.tt030 import RocmSettings, RocmTrainer, rocm

    stock = _llama3()
    config = rocm(stock, grouped_mm_backend="loop")
    assert type(config) is RocmTrainer.Config
    assert issubclass(RocmTrainer, Trainer) and RocmTrainer.Config._owner is RocmTrainer
    assert config.rocm == RocmSettings(grouped_mm_backend="loop")
    for f in dataclasses.fields(stock):
        assert getattr(config, f.name) is getattr(stock, f.name)
    again = rocm(config, moe_eager_compile="off")
    assert (again.rocm.grouped_mm_backend, again.rocm.moe_eager_compile) == ("loop", "off")


def test_rocm_rejects_unknown_settings_and_values_naming_what_is_accepted():
    from titan_rocm.adapters.tt030 import rocm

    with pytest.raises(ValueError, match="unknown key 'moe_eager'; accepted keys: precision"):
        rocm(_llama3(), moe_eager="off")
    with pytest.raises(ValueError, match="moe_eager_compile = 'maybe' is not valid; accepted: au"):
        rocm(_llama3(), moe_eager_compile="maybe")
    with pytest.raises(TypeError, match="needs a TorchTitan 0.3.0 Trainer.Config"):
        rocm(object())


def test_other_trainer_classes_get_one_cached_rocm_class_each():
    from torchtitan.trainer import Trainer

    from titan_rocm.adapters.tt030 import RocmTrainer, rocm, rocm_trainer_class

    @dataclasses.dataclass(kw_only=True, slots=True)
    class MyConfig(Trainer.Config):
        extra: int = 3

    class MyTrainer(Trainer):
        Config = MyConfig

    assert MyTrainer.Config._owner is MyTrainer  # Configurable.__init_subclass__ wired it
    cls = rocm_trainer_class(MyTrainer)
    assert cls is rocm_trainer_class(MyTrainer) and issubclass(cls, MyTrainer)
    assert cls.__name__ == "RocmMyTrainer" and cls.Config._owner is cls
    assert rocm_trainer_class(RocmTrainer) is RocmTrainer
    base = _llama3()
    mine = MyConfig(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, extra=5)
    config = rocm(mine)
    assert type(config) is cls.Config and config.extra == 5


# -- the command line -----------------------------------------------------------------------------

def _parse(*args: str):
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(["--module", "titan_rocm.torchtitan.configs", *args])


def test_module_wraps_any_stock_config_and_rocm_flags_parse():
    from titan_rocm.adapters.tt030 import RocmTrainer

    config = _parse("--config", "deepseek_v3_16b", "--rocm.moe_eager_compile", "off",
                    "--rocm.grouped_mm_backend", "loop", "--training.steps", "7")
    assert type(config) is RocmTrainer.Config
    assert config.model_spec.name == "deepseek_v3" and config.model_spec.flavor == "16B"
    assert config.rocm.moe_eager_compile == "off" and config.rocm.grouped_mm_backend == "loop"
    assert config.training.steps == 7
    assert _parse("--config", "llama3_debugmodel").rocm.moe_eager_compile == "auto"


def test_module_rejects_a_bad_rocm_value_and_an_unknown_config(capsys):
    with pytest.raises(SystemExit) as info:
        _parse("--config", "llama3_debugmodel", "--rocm.moe_eager_compile", "maybe")
    assert info.value.code == 2
    assert "maybe" in capsys.readouterr().err
    with pytest.raises(ValueError, match="'llama3_nope' not found") as error:
        _parse("--config", "llama3_nope")
    assert "llama3_debugmodel" in str(error.value)  # TorchTitan lists what the module has


# -- the real trainer on CPU ----------------------------------------------------------------------

def _layers(trainer):
    return dict(trainer.model_parts[0].layers.named_children())


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["block", "moe"])
def test_moe_blocks_run_eager_and_dense_blocks_stay_compiled(cpu_harness, scope):
    from titan_rocm.adapters.tt030 import rocm
    from titan_rocm.workarounds.moe_blocks import EAGER_FORWARD_CALLS, eager_forward_calls

    EAGER_FORWARD_CALLS.clear()
    stock = cpu_harness.train(cpu_harness.config(_deepseek(), steps=2, compile=True))
    config = rocm(cpu_harness.config(_deepseek(), steps=2, compile=True),
                  moe_eager_compile="on", moe_eager_scope=scope, grouped_mm="on",
                  grouped_mm_backend="torch", precision_casts="off", divergence_guard="off")
    trainer = cpu_harness.build(config)
    layers = _layers(trainer)
    assert layers["0"]._compiled_call_impl is not None  # dense: stock fullgraph compile
    assert layers["1"]._compiled_call_impl is None  # MoE: taken out of it
    inner = layers["1"]._checkpoint_wrapped_module  # SelectiveAC wraps every block
    assert inner._compiled_call_impl is None
    compiled_children = {n for n, c in inner.named_children() if c._compiled_call_impl}
    if scope == "moe":
        assert compiled_children == {"attention", "attention_norm", "ffn_norm"}
    else:
        assert compiled_children == set()
    run = cpu_harness.train(trainer)
    assert eager_forward_calls() == {"1": 2}  # one eager forward of the MoE part per step
    # Same seed, same data: eager MoE parts change nothing but where kernels run.
    assert run.losses == pytest.approx(stock.losses, rel=2e-3)
    decisions = {d.workaround: d.applied for d in trainer._rocm.decisions}
    assert decisions["moe_eager_compile"] and decisions["grouped_mm"]


@pytest.mark.slow
def test_loop_backend_traces_inside_a_fullgraph_moe_block(cpu_harness):
    from titan_rocm.adapters.tt030 import rocm
    from titan_rocm.workarounds.grouped_mm import call_counts
    from titan_rocm.workarounds.grouped_mm.backends import reset_calls

    reset_calls()
    # More steps than Dynamo's recompile limit (8): a count inside the compiled block made
    # every call recompile it, and the tenth call failed the run (fullgraph).
    config = rocm(cpu_harness.config(_deepseek(), steps=10, compile=True),
                  moe_eager_compile="off", grouped_mm="on", grouped_mm_backend="loop",
                  precision_casts="off", divergence_guard="off")
    trainer = cpu_harness.build(config)
    assert _layers(trainer)["1"]._compiled_call_impl is not None  # still compiled whole
    run = cpu_harness.train(trainer)
    assert len(run.losses) == 10 and all(math.isfinite(x) for x in run.losses)
    assert "loop" not in call_counts()  # calls inside a compiled block are not counted


@pytest.mark.slow
@pytest.mark.parametrize("check", ["log_steps", "every_step", "every_step_exact"])
def test_nan_injection_stops_with_the_first_bad_step_not_the_log_step(cpu_harness, monkeypatch,
                                                                      check):
    from titan_rocm.adapters.tt030 import rocm
    from titan_rocm.workarounds.divergence_guard import DivergenceError, hooks

    monkeypatch.setenv("TITAN_ROCM_DEBUG_INJECT_NAN_STEP", "2")
    config = rocm(cpu_harness.config(_llama3(), steps=4), divergence_guard="on",
                  divergence_check=check)
    config.metrics.log_freq = 3  # TorchTitan reads the loss at steps 1 and 3
    try:
        with pytest.raises(DivergenceError) as info:
            cpu_harness.train(config)
    finally:
        hooks.uninstall()
    assert cpu_harness.stopped.code == 17  # the rank ended as a stop, not a crash
    divergence = info.value.divergence
    assert divergence.step == 2  # injected at 2, found at TorchTitan's log step 3
    assert math.isnan(divergence.grad_norm)  # the injection reached the gradients
    if check == "log_steps":  # found where TorchTitan's own check fires, and replaces it
        assert isinstance(info.value.__context__, RuntimeError)
        assert "Loss is not finite" in str(info.value.__context__)
    else:  # found at the end of step 2 (exact) or 3 (one step late), before TorchTitan looks
        assert info.value.__context__ is None


@pytest.mark.slow
def test_override_entry_attaches_the_same_workarounds_to_a_stock_trainer(cpu_harness,
                                                                          monkeypatch):
    from titan_rocm.workarounds.divergence_guard import DivergenceError, hooks
    from titan_rocm.workarounds.grouped_mm import call_counts
    from titan_rocm.workarounds.grouped_mm.backends import reset_calls

    reset_calls()
    monkeypatch.setenv("TITAN_ROCM_DEBUG_INJECT_NAN_STEP", "2")
    config = cpu_harness.config(_deepseek(), steps=3)
    config.metrics.log_freq = 3
    config.override.imports = [("titan_rocm.torchtitan.override.rocm", {
        "grouped_mm": "on", "grouped_mm_backend": "loop", "divergence_guard": "on",
    })]
    trainer = cpu_harness.build(config)
    assert type(trainer).__name__ == "Trainer"  # stock class: the seams are on the instance
    try:
        with pytest.raises(DivergenceError) as info:
            cpu_harness.train(trainer)
    finally:
        hooks.uninstall()
    assert info.value.divergence.step == 2 and cpu_harness.stopped.code == 17
    assert call_counts()["loop"] >= 2


def test_override_entry_rejects_a_bad_setting_when_the_trainer_is_built(cpu_harness):
    config = cpu_harness.config(_llama3(), steps=1)
    config.override.imports = [("titan_rocm.torchtitan.override.rocm", {"grouped_mm": "yes"})]
    with pytest.raises(ValueError, match="grouped_mm = 'yes' is not valid"):
        cpu_harness.build(config)
