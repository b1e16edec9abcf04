"""TorchTitan 0.3.0's real trainer on CPU (the harness), and the 0.3.0 facts titan-rocm builds on.

The facts are what docs/torchtitan-0.3.md says each fix stands on; a TorchTitan release that
moves one of them fails here first, by name.
"""

from __future__ import annotations

import inspect
import math

import pytest


def _stock(name: str):
    """A stock TorchTitan 0.3.0 config function's result."""
    if name.startswith("llama3"):
        from torchtitan.models.llama3 import config_registry
    else:
        from torchtitan.models.deepseek_v3 import config_registry
    return getattr(config_registry, name)()


def test_installed_torchtitan_is_the_0_3_line():
    from titan_rocm import torchtitan_version

    assert torchtitan_version.series() == "0.3"
    import torchtitan.tools.utils as utils

    assert utils.device_type == "cpu"  # tests/tt030/conftest.py ran before TorchTitan loaded


def test_apply_compile_is_the_shared_function_each_parallelize_imports_by_name():
    import torchtitan.distributed.compile as compile_module
    from torchtitan.models.deepseek_v3.parallelize import parallelize_deepseekv3
    from torchtitan.models.llama3.parallelize import parallelize_llama

    for fn in (parallelize_deepseekv3, parallelize_llama):
        assert fn.__globals__["apply_compile"] is compile_module.apply_compile
    params = inspect.signature(compile_module.apply_compile).parameters
    assert list(params) == ["model", "compile_config", "parallel_dims"]


def test_grouped_experts_offer_the_grouped_mm_method_seam():
    from torchtitan.models.common.moe import GroupedExperts
    from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts

    assert list(inspect.signature(GroupedExperts._grouped_mm).parameters) == [
        "self", "A", "B_t", "offs"
    ]
    assert list(inspect.signature(GroupedExperts.forward).parameters)[1:] == [
        "x_RD", "num_tokens_per_expert_E"
    ]
    assert issubclass(GptOssGroupedExperts, GroupedExperts)


def test_trainer_offers_the_method_seams_and_its_config_is_a_slotted_dataclass():
    from torchtitan.trainer import Trainer

    for name in ("forward_backward_step", "train_step", "close", "train", "init_distributed"):
        assert callable(getattr(Trainer, name))
    assert "__slots__" in vars(Trainer.Config)
    assert Trainer.Config._owner is Trainer
    import torchtitan.components.loss as loss_module

    assert "global_vocab_size" in inspect.signature(loss_module.cross_entropy_loss).parameters


@pytest.mark.slow
def test_llama3_debug_model_trains_on_cpu_eager(cpu_harness):
    config = cpu_harness.config(_stock("llama3_debugmodel"), steps=3)
    run = cpu_harness.train(config)
    assert run.steps == [1, 2, 3]
    assert all(math.isfinite(x) for x in run.losses + run.grad_norms)
    assert type(run.trainer).__name__ == "Trainer"


@pytest.mark.slow
def test_deepseek_v3_debug_model_compiled_compiles_every_block_in_place(cpu_harness):
    """Stock 0.3.0 compiles MoE blocks whole (fullgraph), in place: the ROCm hazard."""
    config = cpu_harness.config(_stock("deepseek_v3_debugmodel"), layers=2, steps=2,
                                compile=True)
    trainer = cpu_harness.build(config)
    blocks = dict(trainer.model_parts[0].layers.named_children())
    moe = {layer_id: bool(getattr(b, "moe_enabled", False)) for layer_id, b in blocks.items()}
    assert moe == {"0": False, "1": True}
    for block in blocks.values():
        # nn.Module.compile: the module stays itself, its call goes through torch.compile.
        assert block._compiled_call_impl is not None
    run = cpu_harness.train(trainer)
    assert run.steps == [1, 2]
    assert all(math.isfinite(x) for x in run.losses)
