"""What a graph Dynamo compiled contains, measured against the mixed compile's promise.

The ROCm step-1 NaN ``rocm.moe_eager_compile`` exists for came from EP dispatch/combine and
FSDP hooks in one Inductor graph (AMD-AGI/Primus PR #962); Inductor compiles exactly the
graphs Dynamo hands the backend, so a recording backend sees everything compiled."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

import torch

COLLECTIVE_OPS = re.compile(
    # Not "broadcast" alone: torch.broadcast_tensors is arithmetic. c10d's broadcast matches
    # "c10d", torch.distributed.broadcast "torch.distributed".
    r"c10d|all_to_all|alltoall|all_gather|allgather|reduce_scatter|all_reduce|allreduce"
    r"|wait_tensor|functional_collectives|torch\.distributed",
    re.IGNORECASE,
)
MOE_OPS = re.compile(r"grouped_mm|histc|argsort|topk|bincount|scatter_add|permute_indices",
                     re.IGNORECASE)
MOE_CLASSES = frozenset({"MoE", "TokenChoiceTopKRouter", "TokenReorderer", "GroupedExperts"})
"""Shared experts are a plain ``FeedForward``: a test that knows the model checks them by
parameter."""
MOE_FUNCTIONS = frozenset({
    "_run_experts_grouped_mm", "_run_experts_for_loop", "_permute", "_unpermute",
    "generate_permute_indices", "indices_padding_wrapper", "_token_dispatch", "_token_combine",
})
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line \d+, in (?P<func>\w+)')


@dataclasses.dataclass(frozen=True)
class GraphAudit:
    """One compiled graph: its size, its distinct ops, and what it must not hold."""

    nodes: int
    ops: tuple[str, ...]
    collectives: tuple[str, ...]
    fsdp: tuple[str, ...]
    moe: tuple[str, ...]

    @property
    def clean(self) -> bool:
        """No collective, no FSDP, no MoE routing or expert compute."""
        return not (self.collectives or self.fsdp or self.moe)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "clean": self.clean}


def op_name(node: torch.fx.Node) -> str | None:
    """A readable name of what ``node`` calls (None for placeholders and outputs)."""
    target = node.target
    if node.op == "call_method":
        return f"Tensor.{target}"
    if node.op == "call_module":
        return f"module:{target}"
    if node.op != "call_function":
        return None
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return f"{module}.{name}" if name else repr(target)


def _frames(node: torch.fx.Node) -> Iterable[tuple[str, str]]:
    for m in _FRAME.finditer(node.meta.get("stack_trace") or ""):
        yield m.group("path").replace("\\", "/"), m.group("func")


def _module_classes(node: torch.fx.Node) -> Iterable[type]:
    for entry in (node.meta.get("nn_module_stack") or {}).values():
        cls = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
        if isinstance(cls, type):
            yield cls


def _all_nodes(gm: torch.fx.GraphModule) -> Iterable[torch.fx.Node]:
    # Higher-order ops (an activation-checkpointed block, torch.cond, ...) keep their bodies
    # in sub-GraphModules: read those too.
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            yield from module.graph.nodes


def audit(gm: torch.fx.GraphModule) -> GraphAudit:
    """Read every node of ``gm`` (a graph a Dynamo backend received), subgraphs included."""
    ops: set[str] = set()
    collectives: set[str] = set()
    fsdp: set[str] = set()
    moe: set[str] = set()
    nodes = 0
    for node in _all_nodes(gm):
        nodes += 1
        name = op_name(node)
        if name is not None:
            ops.add(name)
            if COLLECTIVE_OPS.search(name):
                collectives.add(name)
            if "fsdp" in name.lower():
                fsdp.add(name)
            if MOE_OPS.search(name):
                moe.add(name)
        for cls in _module_classes(node):
            if cls.__name__.startswith("FSDP"):
                fsdp.add(f"module {cls.__name__}")
            if cls.__name__ in MOE_CLASSES:
                moe.add(f"module {cls.__name__}")
        for path, func in _frames(node):
            if "/distributed/fsdp/" in path:
                fsdp.add(f"frame {func} ({path.rsplit('/', 1)[-1]})")
            elif "expert_parallel" in path:
                collectives.add(f"frame {func} (expert_parallel.py)")
            elif func in MOE_FUNCTIONS:
                moe.add(f"frame {func}")
    return GraphAudit(nodes, tuple(sorted(ops)), tuple(sorted(collectives)),
                      tuple(sorted(fsdp)), tuple(sorted(moe)))
