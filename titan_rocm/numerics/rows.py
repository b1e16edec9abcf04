"""The micro-batch in runs of whole rows (docs/numerics-audit.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from titan_rocm.numerics.replay import BlockReplay

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


def cut_batch(input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
              cut_rows: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """``cut_rows`` applied to the labels and every input tensor that has their batch rows."""
    batch = labels.shape[0]

    def one(t: Any) -> Any:
        return cut_rows(t) if isinstance(t, torch.Tensor) and t.shape[:1] == (batch,) else t

    return {k: one(v) for k, v in input_dict.items()}, cut_rows(labels)


def take_tokens(input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                tokens: int | None) -> Batch:
    """The first ``tokens`` label positions (whole rows while they fit, else the first ``tokens`` of
    row 0); the whole micro-batch for None."""
    if tokens is None or tokens >= labels.numel():
        return input_dict, labels
    batch, seq = labels.shape[0], labels.shape[-1]
    rows = tokens // seq
    if rows >= 1:
        return cut_batch(input_dict, labels, lambda t: t[:rows])
    return cut_batch(input_dict, labels,
                     lambda t: t[:1, :tokens] if t.dim() >= 2 and t.shape[:2] == (batch, seq)
                     else t)


def row_bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """``rows`` as ``chunks`` runs of whole rows, as even as possible, in order."""
    chunks = max(1, min(chunks, rows))
    edges = [round(i * rows / chunks) for i in range(chunks + 1)]
    return list(zip(edges, edges[1:], strict=False))


def runs_needed(need: int, usable: int, rows: int) -> int:
    """Runs of rows for a replay needing ``need`` bytes in ``usable`` bytes (at most one per
    row)."""
    if need <= usable:
        return 1
    return rows if usable <= 0 else min(rows, math.ceil(need / usable))


def joined(runs: list[BlockReplay]) -> BlockReplay:
    """One block's runs of rows as one (outputs and input gradients joined along the rows)."""
    if len(runs) == 1:
        return runs[0]
    outputs = [torch.cat([r.outputs[i] for r in runs]) if isinstance(o, torch.Tensor) else o
               for i, o in enumerate(runs[0].outputs)]
    grads = {i: torch.cat([r.grad_inputs[i] for r in runs]) for i in runs[0].grad_inputs
             if all(i in r.grad_inputs for r in runs)}
    return BlockReplay(outputs, grads)
