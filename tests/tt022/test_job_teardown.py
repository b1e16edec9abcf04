"""A 0.2.2 job's teardown puts back every attribute its workarounds patched.

TorchTitan 0.2.2's real trainer on CPU (tests/support/audit_trainer.py: the model's own
``parallelize_fn``, compiled), deepseek_v3 (MoE) with ``--model.converters rocm`` and six
workarounds forced on, trained two steps and closed as ``torchtitan.train.main`` closes it.
The attributes are read from their owners before, during and after the job, not from
titan_rocm.patches' registry, so a patch that bypassed it (or one it forgot) fails here.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("torchtitan")

from titan_rocm import patches  # noqa: E402

FORCED = [
    "--rocm.divergence_guard", "on", "--rocm.moe_eager_compile", "on",
    "--rocm.grouped_mm", "on", "--rocm.grouped_mm_backend", "loop",
    "--rocm.precision_casts", "on", "--rocm.triton_war", "on",
    "--rocm.numerics_audit", "first_step",
    "--compile.backend", "eager", "--training.steps", "2", "--metrics.log_freq", "1",
]
ABSENT = object()


@pytest.fixture
def cpu_jobs(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[Any]:
    """The audit trainer importable, on CPU, its MoE experts on the grouped-MM path as on an
    MI300X (capability 9.4; TorchTitan turns it off below 9.0); the environment, ``sys.path``
    and the cache tag put back by hand as well, should a failing job leave them."""
    import torch.compiler.config as compiler_config
    import torchtitan.models.deepseek_v3.model.args as deepseek_args

    from tests.support import cpu_trainer
    from tests.support.moe_test_models import clean_patches
    from titan_rocm.scanner.names import ENV_STATS_DIR

    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    monkeypatch.setattr(deepseek_args, "has_cuda_capability", lambda major, minor: True)
    monkeypatch.delenv("TITAN_ROCM_DEBUG_CORRUPT", raising=False)
    monkeypatch.setenv(ENV_STATS_DIR, str(tmp_path / "stats"))
    saved_env, saved_path = dict(os.environ), list(sys.path)
    # Assigned back by hand: monkeypatch's undo deletes an entry of torch's config modules
    # (their values live outside the module's __dict__), and Inductor then fails on it.
    saved_tag = compiler_config.cache_key_tag
    cpu_trainer.cpu_patches(monkeypatch.setattr)
    monkeypatch.setattr(cpu_trainer.CpuTrainer, "patch_for_cpu", False)
    try:
        with clean_patches(), torch._inductor.config.patch(compile_threads=1):
            from tests.support import audit_trainer

            yield audit_trainer
    finally:
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        compiler_config.cache_key_tag = saved_tag
        patches.restore()


def _own(owner: Any, name: str) -> Any:
    if isinstance(owner, dict):
        return owner.get(name, ABSENT)
    return vars(owner).get(name, ABSENT)


def _watched() -> dict[str, tuple[Any, str]]:
    """Every attribute this job's workarounds patch, by where it is."""
    import torchtitan.components.loss as loss_module
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.models.moe.moe as moe_module
    import triton
    import triton.compiler
    import triton.compiler.compiler
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.protocols.train_spec import get_train_spec

    deepseek = get_train_spec("deepseek_v3").parallelize_fn.__globals__
    return {
        "MetricsProcessor.close": (MetricsProcessor, "close"),  # the guard and the teardown
        "MetricsProcessor.log": (MetricsProcessor, "log"),
        "MetricsProcessor.should_log": (MetricsProcessor, "should_log"),
        "CheckpointManager.save": (CheckpointManager, "save"),
        "CheckpointManager.load": (CheckpointManager, "load"),  # the guard and the audit
        "cross_entropy_loss": (loss_module, "cross_entropy_loss"),
        "clip_grad_norm_": (dist_utils, "clip_grad_norm_"),
        "deepseek apply_compile": (deepseek, "apply_compile"),
        "moe _run_experts_grouped_mm": (vars(moe_module), "_run_experts_grouped_mm"),
        "triton.compiler.compiler.compile": (triton.compiler.compiler, "compile"),
        "triton.compiler.compile": (triton.compiler, "compile"),
        "triton.compile": (triton, "compile"),
    }


def _settings() -> dict[str, Any]:
    """Every process-wide setting the job's workarounds change, read from where it lives:
    Inductor's option (precision_casts), the compile cache tag, the compile workers'
    environment and ``sys.path`` (triton_war)."""
    import torch._inductor.config as inductor_config
    import torch.compiler.config as compiler_config

    from titan_rocm.scanner.names import WORKER_ENV
    from titan_rocm.workarounds.triton_war.cache_tag import CACHE_KEY_TAG_ENV

    env = ("PYTHONPATH", "TORCH_CUSTOM_PYTHONPATH", CACHE_KEY_TAG_ENV, *WORKER_ENV)
    return {
        "emulate_precision_casts": inductor_config.emulate_precision_casts,
        "emulate_precision_casts is default":
            inductor_config._is_default("emulate_precision_casts"),
        "cache_key_tag": compiler_config.cache_key_tag,
        **{f"${key}": os.environ.get(key, ABSENT) for key in env},
        "sys.path": list(sys.path),
    }


def _job(cpu_jobs: Any, stock: dict[str, Any]) -> None:
    """Build, train two steps, close; check every watched attribute and setting while
    training and after."""
    from titan_rocm.adapters.tt022.converters.converter import JOB_ATTR
    from titan_rocm.workarounds.grouped_mm.seams_tt022 import experts_globals

    settings = _settings()
    assert settings["emulate_precision_casts"] is False
    watched = _watched()
    trainer, _ = cpu_jobs.build(cpu_jobs.DEEPSEEK + FORCED)
    model = trainer.model_parts[0]
    job = model.__dict__[JOB_ATTR]
    assert sorted(job.applied_by) == sorted([
        "divergence_guard", "moe_eager_compile", "grouped_mm", "precision_casts",
        "triton_war", "numerics_audit"])
    experts = next(m for m in model.modules() if experts_globals(m) is not None)
    assert experts_globals(experts) is watched["moe _run_experts_grouped_mm"][0]
    try:
        trainer.train()
        during = {where: _own(*at) for where, at in watched.items()}
        assert all(during[w] is not stock[w] for w in watched), [
            w for w in watched if during[w] is stock[w]]
        changed = _settings()
        assert sorted(k for k in settings if changed[k] != settings[k]) == sorted([
            "emulate_precision_casts", "emulate_precision_casts is default", "cache_key_tag",
            "$PYTHONPATH", "$TORCH_COMPILE_CACHE_KEY_TAG", "$TITAN_ROCM_TRITON_WAR",
            "$TITAN_ROCM_TRITON_WAR_RULE", "$TITAN_ROCM_TRITON_WAR_STRICT", "sys.path"])
        assert "forward_backward_step" in vars(trainer)  # the audit's, on the instance
        # The stop's (titan_rocm/adapters/stop.py), on the instance too.
        assert {"train_step", "close"} <= set(vars(trainer))
        assert {p.by for p in patches.installed()} >= {
            "divergence_guard", "moe_eager_compile", "grouped_mm", "triton_war",
            "numerics_audit", "titan-rocm job teardown", "titan-rocm stop"}
    finally:
        trainer.close()
    after = {where: _own(*at) for where, at in watched.items()}
    assert [w for w in watched if after[w] is not stock[w]] == []
    assert _settings() == settings
    assert not {"forward_backward_step", "train_step", "close"} & set(vars(trainer))
    assert "save" not in vars(trainer.checkpointer)
    assert patches.installed() == []
    assert job.patches.patches == []
    results = job.instances["numerics_audit"].results
    assert [r["step"] for r in results] == [1, 2]  # the audit's parts ran through its patches


@pytest.mark.slow
def test_a_jobs_teardown_puts_back_every_patched_attribute_and_a_second_job_patches_again(
        cpu_jobs: Any) -> None:
    from titan_rocm.workarounds.triton_war import compile_hook

    compile_hook.uninstall()
    patches.restore()
    stock = {where: _own(*at) for where, at in _watched().items()}
    _job(cpu_jobs, stock)
    _job(cpu_jobs, stock)  # the same process: installed again, put back again
