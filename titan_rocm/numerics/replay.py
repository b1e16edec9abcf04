"""Teacher-forced replays: each block alone from the job's own inputs and output gradients, and
the parts outside the blocks with every block standing in as what the job computed."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from titan_rocm.numerics import blocks
from titan_rocm.numerics.blocks import Call
from titan_rocm.numerics.precision import cast_input
from titan_rocm.numerics.record import BlockRecord


class ReplayError(RuntimeError):
    """A block cannot be replayed as recorded (the message is one sentence)."""


def rows_of(record: BlockRecord) -> int:
    """The micro-batch rows of a record (its hidden state's first dimension)."""
    hidden = record.hidden()
    return int(hidden.shape[0]) if hidden is not None and hidden.dim() else 1


def _block_mask_type() -> type | None:
    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:
        return None
    return BlockMask


def sliceable(record: BlockRecord) -> bool:
    """Whether the record's inputs can be cut into runs of rows (not, e.g., a folded batch's varlen
    metadata)."""
    hidden = record.hidden()
    if hidden is None or hidden.dim() < 2:
        return False
    lead = tuple(hidden.shape[:2])
    block_mask = _block_mask_type()
    for leaf in record.leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.dim() >= 1 and leaf.shape[0] == lead[0] and tuple(leaf.shape[:2]) != lead:
                return False
        elif block_mask is not None and isinstance(leaf, block_mask):
            if leaf.kv_num_blocks.shape[0] not in (1, lead[0]):
                return False
        elif leaf is not None and not isinstance(leaf, (bool, int, float, str)):
            return False
    return True


def _shifted(mask_mod: Any, lo: int) -> Any:
    def mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return mask_mod(b + lo, h, q_idx, kv_idx)

    return mask


def cut(t: Any, lead: tuple[int, ...], lo: int, hi: int) -> Any:
    """Rows ``[lo, hi)`` of a tensor or ``BlockMask``; its mask function is re-indexed because
    ``BlockMask.__getitem__`` alone leaves one that refuses to run."""
    if isinstance(t, torch.Tensor) and t.dim() >= 2 and tuple(t.shape[:2]) == lead:
        return t[lo:hi]
    block_mask = _block_mask_type()
    if (block_mask is not None and isinstance(t, block_mask) and lead
            and t.kv_num_blocks.shape[0] == lead[0] > 1 and (lo, hi) != (0, lead[0])):
        sliced = t[lo:hi]
        sliced.mask_mod = _shifted(t.mask_mod, lo)
        return sliced
    return t


def _lead(record: BlockRecord) -> tuple[int, ...]:
    hidden = record.hidden()
    return tuple(hidden.shape[:2]) if hidden is not None and hidden.dim() >= 2 else ()


@dataclass
class BlockReplay:
    """One run of rows of one block's replay."""

    outputs: list[Any]
    grad_inputs: dict[int, torch.Tensor]


def replay_block(record: BlockRecord, lo: int, hi: int, dtype: torch.dtype | None) -> BlockReplay:
    """Rows ``[lo, hi)`` of one block, forward from the recorded inputs and backward from the
    recorded output gradients, under the caller's arithmetic."""
    lead = _lead(record)
    leaves: list[Any] = []
    for leaf, needs in zip(record.leaves, record.needs_grad, strict=True):
        leaf = cast_input(cut(leaf, lead, lo, hi), dtype)
        if needs:
            leaf = leaf.detach().requires_grad_()
        leaves.append(leaf)
    args, kwargs = pytree.tree_unflatten(leaves, record.spec)
    out = blocks.call_block(record.module, args, kwargs)
    out_leaves = pytree.tree_leaves(out)
    if len(out_leaves) != len(record.outputs):
        raise ReplayError(f"block {record.key} returned {len(out_leaves)} output(s) in the "
                          f"replay and {len(record.outputs)} in the job")
    backward_recorded(record, out_leaves, lo, hi)
    grad_inputs = {i: leaf.grad for i, (leaf, needs) in enumerate(zip(leaves, record.needs_grad,
                                                                     strict=True))
                   if needs and leaf.grad is not None}
    return BlockReplay([o.detach() if isinstance(o, torch.Tensor) else o for o in out_leaves],
                       grad_inputs)


def backward_recorded(record: BlockRecord, out_leaves: list[Any], lo: int, hi: int) -> None:
    """The backward of a replay's outputs from rows ``[lo, hi)`` of the job's recorded output
    gradients."""
    lead = _lead(record)
    roots, grads = [], []
    for i, o in enumerate(out_leaves):
        g = record.grad_outputs.get(i)
        if isinstance(o, torch.Tensor) and o.requires_grad and g is not None:
            roots.append(o)
            grads.append(cut(g, lead, lo, hi).to(o.dtype))
    if roots:
        torch.autograd.backward(roots, grads)


def _keep(into: list[torch.Tensor | None], index: int, grad: torch.Tensor) -> None:
    into[index] = grad.detach()


class _Teach(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, payload: dict[str, Any], *inputs: torch.Tensor) -> Any:
        ctx.payload = payload
        ctx.shapes = [(t.dtype, t.shape) for t in inputs]
        outs = tuple(o.clone() for o in payload["outputs"])
        return outs if len(outs) != 1 else outs[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        payload = ctx.payload
        payload["arrived"].append([None if g is None else g.detach() for g in grads])
        given = payload["grad_inputs"]
        return (None, *[None if g is None else g.to(dtype)
                        for g, (dtype, _) in zip(given, ctx.shapes, strict=True)])


@dataclass
class StandIn:
    """The block-boundary interceptor of an outside replay."""

    records: dict[str, BlockRecord]
    lo: int
    hi: int
    dtype: torch.dtype | None
    first_input: list[torch.Tensor] = field(default_factory=list)
    """The embedding's output."""
    last_grad: list[list[torch.Tensor | None]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def around(self, key: str, module: nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any], proceed: Call) -> Any:
        record = self.records[key]
        lead = _lead(record)
        leaves, _ = pytree.tree_flatten((args, kwargs))
        keys = list(self.records)
        if key == keys[0]:
            hidden = next((t for t, g in zip(leaves, record.needs_grad, strict=False)
                           if g and isinstance(t, torch.Tensor)), None)
            if hidden is not None:
                self.first_input.append(hidden.detach())
        self.calls.append(key)
        inputs = [t for t, g in zip(leaves, record.needs_grad, strict=False)
                  if g and isinstance(t, torch.Tensor) and t.requires_grad]
        given = [record.grad_inputs.get(i) for i, g in enumerate(record.needs_grad) if g]
        given = [None if g is None else cut(g, lead, self.lo, self.hi) for g in given]
        given = given[:len(inputs)]
        leaves_out = [cast_input(cut(o, lead, self.lo, self.hi), self.dtype)
                      for o in record.outputs]
        where = [i for i, o in enumerate(leaves_out) if isinstance(o, torch.Tensor)]
        arrived: list[list[torch.Tensor | None]] = (
            self.last_grad if key == keys[-1] else [])
        payload = {"outputs": [leaves_out[i] for i in where], "grad_inputs": given,
                   "arrived": arrived}
        if inputs and torch.is_grad_enabled():
            out = _Teach.apply(payload, *inputs)
            taught = list(out) if isinstance(out, tuple) else [out]
        elif torch.is_grad_enabled():
            # No input needs a gradient (a frozen embedding): the outputs are where the
            # backward stops, and what arrives at them is kept as _Teach keeps it.
            taught = [leaves_out[i].clone().requires_grad_(leaves_out[i].is_floating_point())
                      for i in where]
            grads: list[torch.Tensor | None] = [None] * len(taught)
            arrived.append(grads)
            for j, t in enumerate(taught):
                if t.requires_grad:
                    t.register_hook(functools.partial(_keep, grads, j))
        else:
            taught = [leaves_out[i].clone() for i in where]
        for i, t in zip(where, taught, strict=True):
            leaves_out[i] = t
        return pytree.tree_unflatten(leaves_out, record.out_spec)
