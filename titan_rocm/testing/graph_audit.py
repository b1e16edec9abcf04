"""What a graph Dynamo compiled contains, measured against the mixed compile's promise.

The ROCm step-1 NaN that ``rocm.moe_eager_compile`` exists for came from whole-block MoE
compile putting EP dispatch/combine and FSDP hooks into one Inductor graph (AMD-AGI/Primus
PR #962, merged). Inductor compiles exactly the graphs Dynamo hands to the compile backend, so a
backend that records every graph sees everything that is compiled (compiled autograd off,
as in TorchTitan 0.2.2). :func:`audit` reads one such ``torch.fx.GraphModule`` and lists
what it must not contain:

- ``collectives``: any communication op (functional collectives, ``all_to_all``,
  ``all_gather``, ``reduce_scatter``, ``all_reduce``, ``wait_tensor``, any ``c10d`` or
  ``torch.distributed`` call, DTensor's included) or
  a frame of EP's dispatch/combine (``torchtitan/distributed/expert_parallel.py``);
- ``fsdp``: an FSDP op, an FSDP-managed module, or a frame of FSDP's hooks;
- ``moe``: the MoE module's token routing and expert compute: the router's ``topk`` and
  ``histc``, the permutation's ``argsort`` and its index kernels, the grouped GEMM, an MoE
  module class in the graph's module stack, or a frame of TorchTitan's permutation / experts
  functions.

Used by ``tests/tt022/test_moe_scope_inspection.py`` (CPU, FSDP + EP over gloo) and by
``benchmarks/torchtitan_runner.py`` (``TITAN_ROCM_RECORD_GRAPHS=1``, on GPUs). Torch-only:
no TorchTitan import.
"""

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
"""TorchTitan 0.2.2's MoE module and its routed parts (shared experts are a plain
``FeedForward``, like a dense block's: a test that knows the model checks them by parameter)."""
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
        """JSON-able form (with ``clean``)."""
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
