"""The attention kinds MLA on aiter tells apart, on either TorchTitan version, and how plans
name them."""

from __future__ import annotations

DENSE, FLEX_CAUSAL, VARLEN, DROPPED = "sdpa", "flex", "varlen", "dropped"
ATTENTION_LABELS = {
    DENSE: "sdpa (causal): aiter dense attention",
    FLEX_CAUSAL: "flex (causal mask): aiter dense attention",
    VARLEN: "varlen (block_causal mask): aiter varlen attention within each document",
    DROPPED: "flex (block_causal mask dropped): aiter dense causal attention across documents",
}
"""How each attention kind shows in plans."""
