"""Attribution: for each parameter, its block, whether it ran compiled, and which titan-rocm
workarounds shaped it, read from the built model and its job's decisions (no gate is re-run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn
from torch._dynamo.eval_frame import OptimizedModule

from titan_rocm.workarounds import moe_blocks

GLOBAL_COMPILED = ("precision_casts", "triton_war", "gemm_lookup")
"""Workarounds that act on every compiled kernel: they shape compiled parameters only."""


WRAPPERS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
"""Module names torch.compile, activation checkpointing and FSDP1 insert into FQNs."""


def clean_name(name: str) -> str:
    """A parameter's FQN as the user's model names it (wrapper modules removed)."""
    for wrapper in WRAPPERS:
        name = name.replace(wrapper, "")
    return name


def _job_of(model: nn.Module) -> Any:
    from titan_rocm.adapters.tt022.converters.converter import JOB_ATTR

    return model.__dict__.get(JOB_ATTR) or getattr(model, "_titan_rocm_job", None)


@dataclass
class Attribution:
    """Facts about the model's blocks and parameters, taken once before the passes."""

    compiled_prefixes: list[str] = field(default_factory=list)
    """Clean FQNs of modules that run compiled (``torch.compile`` wrapper or in place)."""
    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Layer id (``model.layers`` key, as ``TITAN_ROCM_DEBUG_CORRUPT``'s ``block=`` names it)
    -> {"moe": bool, "mixed_compile": str | None}, in forward order."""
    applied: list[str] = field(default_factory=list)
    """titan-rocm workarounds the job applied, in apply order."""
    notes: list[str] = field(default_factory=list)
    """What the applied workarounds say they did (:meth:`Workaround.audit_note`)."""

    def block_of(self, name: str) -> str | None:
        """The layer id of a parameter FQN (``layers.<id>.…``), None outside the blocks."""
        parts = name.split(".")
        if len(parts) > 2 and parts[0] == "layers":
            return parts[1]
        return None

    @staticmethod
    def prefix(block: str) -> str:
        """The FQN prefix of a block: ``layers.<id>``."""
        return f"layers.{block}"

    def order(self, block: str | None) -> int:
        """Forward position of a block (-1 for none or unknown)."""
        keys = list(self.blocks)
        return keys.index(block) if block in keys else -1

    def compiled(self, name: str) -> bool:
        """Whether the module holding ``name`` ran under ``torch.compile``."""
        return any(name == p or name.startswith(p + ".") or not p
                   for p in self.compiled_prefixes)

    def _block_params_compiled(self, block: str | None) -> list[bool]:
        if block is None or block not in self.blocks:
            return []
        block = self.prefix(block)
        # A block is compiled where its wrapper is, or where compiled children lie inside.
        inside = [p for p in self.compiled_prefixes if p == block or p.startswith(block + ".")
                  or not p or block.startswith(p + ".")]
        whole = any(p == block or not p or block.startswith(p + ".") for p in inside)
        return [True] if whole else ([True, False] if inside else [False])

    def block_compiled(self, block: str | None) -> bool | None:
        """True: the block (or part of it) ran compiled; False: eager; None: not a block."""
        flags = self._block_params_compiled(block)
        return None if not flags else any(flags)

    def block_scope(self, block: str | None) -> str | None:
        """``compiled``, ``eager`` or ``mixed`` (some children compiled, some not)."""
        flags = self._block_params_compiled(block)
        if not flags:
            return None
        return "mixed" if len(set(flags)) == 2 else ("compiled" if flags[0] else "eager")

    def workarounds(self, name: str) -> list[str]:
        """The applied workarounds that shaped parameter ``name``'s gradient."""
        block = self.block_of(name)
        facts = self.blocks.get(block or "", {})
        shaped = []
        compiled = self.compiled(name)
        for w in self.applied:
            if w in GLOBAL_COMPILED and compiled:
                shaped.append(w)
            elif w == "moe_eager_compile" and facts.get("mixed_compile"):
                shaped.append(f"moe_eager_compile ({facts['mixed_compile']})")
            elif w == "grouped_mm" and facts.get("moe") and ".moe." in f".{name}.":
                shaped.append("grouped_mm")
            elif w == "mla_ck_backward" and ".attention." in f".{name}.":
                shaped.append("mla_ck_backward")
        return shaped

    def block_workarounds(self, block: str | None) -> list[str]:
        """The union of :meth:`workarounds` over a block's parts."""
        facts = self.blocks.get(block or "", {})
        if block is None:
            return []
        at = self.prefix(block)
        probe = [f"{at}.attention.x", f"{at}.moe.x" if facts.get("moe") else f"{at}.x"]
        seen: list[str] = []
        for name in probe:
            for w in self.workarounds(name):
                if w not in seen:
                    seen.append(w)
        return seen


def attribute(model_parts: list[nn.Module]) -> Attribution:
    """The :class:`Attribution` of a built (converted, parallelised, compiled) model."""
    result = Attribution()
    for part in model_parts:
        for name, module in part.named_modules():
            if isinstance(module, OptimizedModule) or moe_blocks.compiled_in_place(module):
                result.compiled_prefixes.append(clean_name(name + ".").rstrip("."))
        layers = getattr(part, "layers", None)
        if layers is not None:
            mixed = {}
            job = _job_of(part)
            if job is not None:
                new = [n for n in job.instances if n in job.applied_by
                       and n not in result.applied]
                result.applied += new
                result.notes += [note for n in new
                                 if (note := job.instances[n].audit_note()) is not None]
                mec = job.instances.get("moe_eager_compile")
                if "moe_eager_compile" in job.applied_by and mec is not None:
                    mixed = moe_blocks.plan_blocks(part, getattr(mec, "scope", "block"))
            for layer_id, block in layers.named_children():
                result.blocks[layer_id] = {
                    "moe": moe_blocks.is_moe_block(block),
                    "mixed_compile": mixed.get(layer_id),
                }
    return result
