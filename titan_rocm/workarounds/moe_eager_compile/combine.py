"""``[rocm] moe_combine``: how an eager MoE module of TorchTitan 0.2.2 combines its experts.

``"bf16"`` sums the BF16 outputs instead of stock's FP32 copy of every routed output, as
AMD-AGI/Primus PR #962 does (``dsv3_v022_perf_patches.py``, 64c3261b); docs/moe-eager-compile.md."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

COMBINES: dict[str, str] = {
    "fp32": "TorchTitan's: bmm of the router scores with an FP32 copy of the expert outputs",
    "bf16": ("AMD-AGI/Primus PR #962's: weighted sum over the expert outputs in their own dtype "
             "(no FP32 copy kept for the backward)"),
}

_SUBCLASSES: dict[type, type] = {}


def weighted_combine(
    routed_output: torch.Tensor, token_indices: torch.Tensor, top_scores: torch.Tensor,
    out_dtype: torch.dtype, *, weighted: bool = True,
) -> torch.Tensor:
    """Each token's ``top_k`` expert outputs, weighted by ``top_scores`` unless ``weighted`` is
    False, summed in FP32 and cast to ``out_dtype``."""
    tokens, top_k = top_scores.shape
    unsorted = routed_output.new_zeros(tokens * top_k, routed_output.shape[-1])
    # index_put_ keeps only the indices for its backward (index_copy would keep the outputs).
    unsorted.index_put_((token_indices,), routed_output)
    unsorted = unsorted.view(tokens, top_k, -1)
    if not weighted:
        return unsorted.sum(dim=1).to(out_dtype)
    # mul keeps its inputs for the backward (the outputs in their dtype, the scores); the
    # promoted product and the sum keep nothing.
    return (unsorted * top_scores.unsqueeze(-1)).sum(dim=1).to(out_dtype)


def _forward_bf16_combine(self: Any, x: torch.Tensor) -> torch.Tensor:
    """TorchTitan 0.2.2's ``MoE.forward`` with :func:`weighted_combine` as its combine."""
    bs, slen, dim = x.shape
    flat = x.view(-1, dim)
    top_scores, chosen, tokens_per_expert = self.router(flat, self.expert_bias)
    with torch.no_grad():  # load-balancing counts, as stock
        self.tokens_per_expert.add_(tokens_per_expert)
    scores_sorted, token_indices, tokens_per_expert = self.reorderer(top_scores, chosen)
    routed_input = flat[token_indices // self.router.top_k]
    if self.score_before_experts:
        routed_input = (routed_input.float() * scores_sorted.reshape(-1, 1)).to(x.dtype)
    routed_output = self.experts(routed_input, tokens_per_expert)
    shared = self.shared_experts(flat) if self.shared_experts is not None else None
    combined = weighted_combine(routed_output, token_indices, top_scores, x.dtype,
                                weighted=not self.score_before_experts)
    if shared is not None:
        combined = shared + combined
    return combined.reshape(bs, slen, dim)


def use_bf16_combine(moe: nn.Module) -> bool:
    """Give ``moe`` the BF16 combine; False if it has it already. The class is swapped because the
    mixed compile's eager wrapper calls ``type(module).forward``."""
    cls = type(moe)
    if cls in _SUBCLASSES.values():
        return False
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        sub = type(f"{cls.__name__}BF16Combine", (cls,), {"forward": _forward_bf16_combine})
        _SUBCLASSES[cls] = sub
    moe.__class__ = sub
    return True


def has_bf16_combine(moe: nn.Module) -> bool:
    """``moe`` combines with :func:`weighted_combine`."""
    return type(moe) in _SUBCLASSES.values()
