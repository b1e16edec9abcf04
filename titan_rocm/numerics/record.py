"""What the job's own step sent through each block: the audit's teacher-forcing record.

References to the job's tensors, never copies; gradient hooks go on a view of the input, so
other readers of the tensor add nothing."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from titan_rocm.numerics import blocks
from titan_rocm.numerics.blocks import Call


class RecordError(RuntimeError):
    """The job pass cannot be recorded block by block (the message is one sentence)."""


@dataclass
class BlockRecord:
    """One block's call in the job pass."""

    key: str
    module: nn.Module
    spec: Any
    leaves: list[Any]
    """Tensors detached from the job's graph (same storage), else as given."""
    needs_grad: list[bool]
    out_spec: Any
    outputs: list[Any]
    grad_inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    grad_outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    autocast: tuple[bool, torch.dtype | None] = (False, None)
    saved_bytes: int | None = None
    """GPU memory the block's forward kept: where the replays' memory estimate starts."""

    @property
    def device(self) -> torch.device:
        """The device of the block's first tensor input."""
        for leaf in self.leaves:
            if isinstance(leaf, torch.Tensor):
                return leaf.device
        return torch.device("cpu")

    def hidden(self) -> torch.Tensor | None:
        """The first input that requires grad (the hidden state), else the first tensor."""
        tensors = [(t, g) for t, g in zip(self.leaves, self.needs_grad, strict=True)
                   if isinstance(t, torch.Tensor)]
        for t, g in tensors:
            if g:
                return t
        return tensors[0][0] if tensors else None

    def record_bytes(self) -> int:
        """Bytes this record holds that the job would otherwise have freed (the gradients)."""
        grads = [*self.grad_inputs.values(), *self.grad_outputs.values()]
        return sum(_nbytes(g) for g in grads)


def _nbytes(t: torch.Tensor) -> int:
    local = t.to_local() if callable(getattr(t, "to_local", None)) else t
    return local.numel() * local.element_size()


class Recorder:
    """Records every block call of the job pass."""

    def __init__(self) -> None:
        self.records: dict[str, BlockRecord] = {}
        self.keys: set[str] | None = None
        """None: every one; the others run as they would."""

    def around(self, key: str, module: nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any], proceed: Call) -> Any:
        if self.keys is not None and key not in self.keys:
            return proceed(args, kwargs)
        if key in self.records:
            raise RecordError(f"block {key} ran twice in one forward: the audit replays each "
                              "block once (a model that reuses a block is not audited)")
        leaves, spec = pytree.tree_flatten((args, kwargs))
        needs = [isinstance(t, torch.Tensor) and t.requires_grad for t in leaves]
        if torch.is_grad_enabled():
            # A view of each input: its gradient is what this block's backward gives it,
            # whatever else also reads the tensor (a residual kept outside the block).
            leaves = [t.view_as(t) if g else t for t, g in zip(leaves, needs, strict=True)]
            args, kwargs = pytree.tree_unflatten(leaves, spec)
        device = next((t.device for t in leaves if isinstance(t, torch.Tensor)), None)
        autocast: tuple[bool, torch.dtype | None] = (False, None)
        if device is not None and device.type in ("cuda", "cpu"):
            autocast = (torch.is_autocast_enabled(device.type),
                        torch.get_autocast_dtype(device.type))
        before = _allocated(device)
        out = proceed(args, kwargs)
        after = _allocated(device)
        out_leaves, out_spec = pytree.tree_flatten(out)
        record = BlockRecord(
            key=key, module=module, spec=spec,
            leaves=[t.detach() if isinstance(t, torch.Tensor) else t for t in leaves],
            needs_grad=needs, out_spec=out_spec,
            outputs=[t.detach() if isinstance(t, torch.Tensor) else t for t in out_leaves],
            autocast=autocast,
            saved_bytes=None if before is None or after is None else max(0, after - before),
        )
        if torch.is_grad_enabled():
            for i, t in enumerate(leaves):
                if needs[i]:
                    t.register_hook(functools.partial(_hook, record.grad_inputs, i))
            for i, t in enumerate(out_leaves):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(functools.partial(_hook, record.grad_outputs, i))
        self.records[key] = record
        return out

    def held_bytes(self) -> int:
        """Gradient bytes the records hold (the inputs are the job's own activations)."""
        return sum(r.record_bytes() for r in self.records.values())


def _hook(into: dict[int, torch.Tensor], index: int, grad: torch.Tensor) -> None:
    into[index] = grad.detach()


def _allocated(device: torch.device | None) -> int | None:
    if device is None or device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device)


def recorder_for(model_parts: list[nn.Module]) -> tuple[Recorder, list[tuple[str, nn.Module]]]:
    """A recorder for ``model_parts``' blocks (marked here), and the blocks in forward order
    (RecordError without ``model.layers``)."""
    found = [kb for part in model_parts for kb in blocks.mark(part)]
    if not found:
        raise RecordError("the model has no model.layers: the audit compares it block by "
                          "block and found no blocks")
    return Recorder(), found
