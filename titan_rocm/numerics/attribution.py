"""Attribution: whether each audited segment ran compiled and which workarounds shaped it, from
the job's own decisions (no gate is re-run, no workaround or adapter imported)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn
from torch._dynamo.eval_frame import OptimizedModule

SHAPES = ("compiled", "listed", "moe", "every")

WRAPPERS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
"""Module names torch.compile, activation checkpointing and FSDP1 insert into FQNs."""

EMBEDDING, HEAD = "embedding", "head"


def clean_name(name: str) -> str:
    """A parameter's FQN as the user's model names it (wrapper modules removed)."""
    for wrapper in WRAPPERS:
        name = name.replace(wrapper, "")
    return name


@dataclass
class JobFacts:
    """What the job's titan-rocm workarounds did, as plain data (``JobWorkarounds.audit_facts``)."""

    applied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    shapes: dict[str, str] = field(default_factory=dict)
    blocks: dict[str, dict[str, str]] = field(default_factory=dict)
    """Workaround -> block key -> how it runs that block (``moe_eager_compile``: fullgraph, or
    eager)."""


def compiled_in_place(module: nn.Module) -> bool:
    """TorchTitan 0.3.0 compiles blocks with ``module.compile()``."""
    return getattr(module, "_compiled_call_impl", None) is not None


def _compiled_prefixes(part: nn.Module) -> list[str]:
    return [clean_name(name + ".").rstrip(".") for name, module in part.named_modules()
            if isinstance(module, OptimizedModule) or compiled_in_place(module)]


def inner_module(block: nn.Module) -> nn.Module:
    """The module under ``block``'s compile and activation-checkpoint wrappers."""
    seen = block
    for _ in range(8):
        inner = getattr(seen, "_orig_mod", None) or getattr(
            seen, "_checkpoint_wrapped_module", None)
        if inner is None:
            return seen
        seen = inner
    return seen


@dataclass
class Segment:
    """One segment of the audit."""

    name: str
    kind: str
    scope: str | None
    """``mixed``: some children compiled; None outside blocks."""
    moe: bool = False
    workarounds: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``block 3``, or the outside segment's name."""
        return f"block {self.name}" if self.kind == "block" else self.name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"segment": self.name, "kind": self.kind, "scope": self.scope,
                "compiled": None if self.scope is None else self.scope != "eager",
                "moe": self.moe, "workarounds": self.workarounds}


def _shaped(facts: JobFacts, key: str, scope: str, moe: bool) -> list[str]:
    shaped = []
    for name in facts.applied:
        shape = facts.shapes.get(name)
        listed = facts.blocks.get(name, {})
        if shape == "listed" and key in listed:
            shaped.append(f"{name} ({listed[key]})")
        elif (shape == "compiled" and scope != "eager") or (shape == "moe" and moe) \
                or shape == "every":
            shaped.append(name)
    return shaped


def segments(model_parts: list[nn.Module], facts: JobFacts | None) -> list[Segment]:
    """The audit's segments in forward order, each with its compile scope and workarounds."""
    facts = facts or JobFacts()
    found: list[Segment] = [Segment(EMBEDDING, "embedding", None)]
    for part in model_parts:
        prefixes = _compiled_prefixes(part)
        layers = getattr(part, "layers", None)
        if not isinstance(layers, nn.Module):
            continue
        for key, block in layers.named_children():
            at = f"layers.{key}"
            inside = [p for p in prefixes if p == at or p.startswith(at + ".") or not p
                      or at.startswith(p + ".")]
            whole = any(p == at or not p or at.startswith(p + ".") for p in inside)
            scope = "compiled" if whole else ("mixed" if inside else "eager")
            moe = bool(getattr(inner_module(block), "moe_enabled", False))
            found.append(Segment(key, "block", scope, moe, _shaped(facts, key, scope, moe)))
    found.append(Segment(HEAD, "head", None))
    return found
