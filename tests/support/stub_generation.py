"""A stub TorchTitan generation, as a new release would plug in: one adapter (it builds the
job's Context) and one seam per workaround that reaches into TorchTitan's code. Each seam
records what the workaround asked, so a test can show the decision logic ran through it."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from titan_rocm.platform import PlatformFacts
from titan_rocm.settings import RocmSettings
from titan_rocm.workarounds.base import CompileSettings, Context, TrainerSeam
from titan_rocm.workarounds.seams import Generation

FRAMEWORK = "torchtitan 9.9 (stub)"
CALLS: list[tuple[str, str]] = []
"""(workaround, seam method) in call order."""


class _Recording:
    workaround = ""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def _call(self, method: str) -> None:
        CALLS.append((self.workaround, method))


class GroupedMMSeam(_Recording):
    workaround = "grouped_mm"
    counts_note = " (stub)"

    def check(self, model: nn.Module) -> str | None:
        self._call("check")
        return None

    def bind(self, model: nn.Module, backend: str, why: str) -> list[str]:
        self._call("bind")
        return [f"stub experts ({backend})"]

    def layer_backends(self, model: nn.Module) -> dict[str, str]:
        self._call("layer_backends")
        return {"layers.0.moe.experts": "stub"}

    def experts_compile(self, backend: str) -> str:
        return "as the stub compiles them"


class MixedCompileSeam(_Recording):
    workaround = "moe_eager_compile"

    def apply(self, model: nn.Module, scope: str) -> str:
        self._call("apply")
        return f"stub compile ({scope})"


class GuardSeam(_Recording):
    workaround = "divergence_guard"
    loss_observed = "the stub trainer's loss"

    def install(self, monitor: Any) -> TrainerSeam | None:
        self._call("install")
        return TrainerSeam()


class AuditSeam(_Recording):
    workaround = "numerics_audit"

    def install(self, audit: Any) -> TrainerSeam | None:
        self._call("install")
        return TrainerSeam()

    def step(self, trainer: Any, labels: Any) -> Any:
        raise AssertionError("a stub trainer is never audited")


class MLASeam(_Recording):
    workaround = "mla_ck_backward"
    stock = "the stub's attention"
    document_masks = "stub documents"

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        self._call("attention_modules")
        return [(fqn, m) for fqn, m in model.named_modules() if hasattr(m, "inner_attention")]

    def kinds(self, model: nn.Module, drop_documents: bool) -> dict[str, str | None]:
        self._call("kinds")
        return {fqn: None for fqn, _m in self.attention_modules(model)}

    def check(self, model: nn.Module, kinds: dict[str, str | None], parallel: Any) -> str | None:
        self._call("check")
        return None

    def replace(self, model: nn.Module, kinds: dict[str, str | None]) -> Any:
        raise AssertionError("a stub model has nothing to replace")

    def masks(self, model: nn.Module) -> str:
        return "causal"

    def save_forward_in_op_sac(self) -> str | None:
        return None

    def attention_dtype(self) -> str:
        return "bfloat16"

    def machine_facts_when_skipped(self, model: nn.Module) -> bool:
        return False


SEAMS = {cls.workaround: f"{__name__}:{cls.__name__}"
         for cls in (GroupedMMSeam, MixedCompileSeam, GuardSeam, AuditSeam, MLASeam)}
"""One seam for every shipped workaround that has one (test_stub_generation holds it)."""
STUB = Generation(FRAMEWORK, SEAMS)


def job_context(settings: RocmSettings, platform: PlatformFacts,
                generation: Generation = STUB) -> Context:
    """The stub adapter: the Context of a stub job (compiled, one rank)."""
    def parallelize(model: nn.Module) -> nn.Module:  # the stub's parallelize_fn
        return model

    parallelize.__globals__.setdefault("apply_compile", None)
    return Context(settings=settings, platform=platform, framework=FRAMEWORK,
                   compile=CompileSettings(enable=True, components=("model",)),
                   parallelize_fn=parallelize, generation=generation)
