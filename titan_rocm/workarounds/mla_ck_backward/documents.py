"""Per-document (``block_causal``) attention as varlen spans, from TorchTitan's own
``create_varlen_metadata_for_document`` (docs/mla-ck-backward.md).

:class:`DocumentSpans` subclasses ``BlockMask`` only to pass DeepSeek's ``isinstance`` check;
:func:`install` sets an instance attribute, which FSDP's class swap and PP's deepcopy keep."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

MARK = "_titan_rocm_document_spans"
"""Attribute set on the replacement ``get_attention_masks``."""


class DocumentSpans(BlockMask):
    """The documents of a packed batch as varlen metadata (``cu_seqlens``, ``max_seqlen``), passed
    where a ``BlockMask`` goes."""

    cu_seqlens: Tensor
    max_seqlen: int
    batch: int
    seqlen: int

    @classmethod
    def of(cls, cu_seqlens: Tensor, max_seqlen: int, batch: int, seqlen: int) -> DocumentSpans:
        """Spans of ``batch`` samples of ``seqlen`` tokens; ValueError unless ``cu_seqlens`` runs
        from 0 to ``batch * seqlen``."""
        bounds = cu_seqlens.detach()
        if bounds.dim() != 1 or bounds.numel() < 2:
            raise ValueError(f"cu_seqlens of shape {tuple(bounds.shape)} is not valid; "
                             "accepted: a 1-d tensor of at least 2 offsets")
        none = torch.zeros((batch, 1, 1), dtype=torch.int32, device=cu_seqlens.device)
        spans = cls.from_kv_blocks(none, none.unsqueeze(-1), seq_lengths=(seqlen, seqlen))
        spans.cu_seqlens = cu_seqlens.to(torch.int32)
        spans.max_seqlen = int(max_seqlen)
        spans.batch, spans.seqlen = int(batch), int(seqlen)
        return spans

    def dense_mask(self) -> Tensor:
        """``(batch, 1, seqlen, seqlen)`` bool: True where a query may attend to a key."""
        return dense_mask(self.cu_seqlens, self.batch, self.seqlen)

    def __repr__(self) -> str:
        return (f"DocumentSpans(batch={self.batch}, seqlen={self.seqlen}, "
                f"documents={self.cu_seqlens.numel() - 1}, max_seqlen={self.max_seqlen})")


def document_ids(cu_seqlens: Tensor, batch: int, seqlen: int) -> Tensor:
    """Each token's document index, ``(batch, seqlen)``, with no host sync."""
    tokens = torch.arange(batch * seqlen, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:], tokens, right=True).view(batch, seqlen)


def dense_mask(cu_seqlens: Tensor, batch: int, seqlen: int) -> Tensor:
    """``(batch, 1, seqlen, seqlen)`` bool: True where a query may attend to a key (causal
    within its document), for fallbacks that need the mask itself."""
    ids = document_ids(cu_seqlens, batch, seqlen)
    same = ids[:, :, None] == ids[:, None, :]
    causal = torch.ones(seqlen, seqlen, dtype=torch.bool, device=ids.device).tril()
    return (same & causal)[:, None]


def document_spans(input_batch: Tensor, eos_id: int) -> DocumentSpans:
    """The documents of ``input_batch`` (``(batch, seqlen)`` token ids), split as TorchTitan's
    document mask splits them."""
    from torchtitan.models.attention import create_varlen_metadata_for_document

    batch, seqlen = input_batch.shape
    meta = create_varlen_metadata_for_document(input_batch, eos_id)
    return DocumentSpans.of(meta.cu_seq_q, int(meta.max_q), batch, seqlen)


def get_attention_masks(
    input_batch: Tensor, tokenizer: Any, extra_inputs: dict[str, Tensor] | None = None
) -> DocumentSpans:
    """Replacement for DeepSeek V3's ``get_attention_masks`` under ``block_causal`` masks."""
    eos_id = getattr(tokenizer, "eos_id", None)
    if eos_id is None:
        raise ValueError("block_causal attention needs the tokenizer's eos_id; this tokenizer "
                         "has none (TorchTitan's own mask asserts the same)")
    return document_spans(input_batch, eos_id)


setattr(get_attention_masks, MARK, True)


def install(model: nn.Module) -> bool:
    """Make ``model.get_attention_masks`` return :class:`DocumentSpans`; False if it already does.
    """
    if installed(model):
        return False
    model.get_attention_masks = get_attention_masks  # type: ignore[method-assign]
    return True


def installed(model: nn.Module) -> bool:
    """``model``'s attention masks are titan-rocm's document spans."""
    return bool(getattr(getattr(model, "get_attention_masks", None), MARK, False))
