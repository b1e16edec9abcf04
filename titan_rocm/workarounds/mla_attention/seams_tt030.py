"""TorchTitan 0.3.0's seams of MLA attention: inner-attention configs of titan-rocm's own in the
model's config tree (:mod:`.tt030`); on TorchTitan main's folded tokens, replacements that take
``(T, N, H)`` (:class:`FoldedSeam`, over :mod:`.tt030_folded`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch.nn as nn

from titan_rocm.workarounds.mla_attention import tt030, tt030_folded
from titan_rocm.workarounds.mla_attention.kinds import VARLEN


class Seam:
    """:class:`~.workaround.MLASeam` for TorchTitan 0.3.0."""

    stock = "TorchTitan's ScaledDotProductAttention, FlexAttention and causal VarlenAttention"
    document_masks = tt030.DOCUMENT_MASKS

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """Every 0.3.0 DeepSeek V3 ``Attention``."""
        return tt030.attention_modules(model)

    layout = tt030.BATCHED
    """The replacement of each kind."""

    def kinds(self, model: nn.Module, drop_documents: bool) -> dict[str, str | None]:
        """Each attention's kind, by its inner attention's class."""
        return {fqn: tt030.attention_kind(m, drop_documents, self.layout)
                for fqn, m in tt030.attention_modules(model)}

    def check(self, model: nn.Module, kinds: dict[str, str | None], parallel: Any) -> str | None:
        """Per-document masks need no PP; every replaced attention needs its config."""
        if VARLEN in kinds.values() and parallel.pp_enabled:
            return tt030.PP_REASON
        return tt030.check(model, kinds)

    def masks(self, model: nn.Module) -> str:
        """0.3.0 drops only per-document masks."""
        return "block_causal"

    def replace(self, model: nn.Module, kinds: dict[str, str | None]) -> Counter[str]:
        """Swap the inner-attention configs and modules."""
        return Counter(tt030.replace(model, kinds))

    def save_forward_in_op_sac(self) -> str | None:
        """``_get_default_save_ops`` returns the forward ops too."""
        return tt030.save_forward_in_op_sac()

    def attention_dtype(self) -> str:
        """As 0.3.0's DeepSeek ``parallelize_fn`` sets it up."""
        return tt030.attention_dtype(self.ctx.training_dtype, self.ctx.mixed_precision_param)

    def machine_facts_when_skipped(self, model: nn.Module) -> bool:
        """A skipped 0.3.0 plan shows nothing (as before the seams)."""
        return False


class FoldedSeam(Seam):
    """:class:`~.workaround.MLASeam` for TorchTitan main, whose batch is folded into the token
    dimension (pytorch/torchtitan #4121): q/k/v ``(T, N, H)``, both mask kinds through aiter's
    varlen entry points."""

    stock = ("TorchTitan's FlexAttention and causal VarlenAttention (on folded (T, N, H) "
             "tokens, where language models refuse ScaledDotProductAttention)")
    document_masks = tt030_folded.DOCUMENT_MASKS
    layout = tt030_folded.FOLDED

    def check(self, model: nn.Module, kinds: dict[str, str | None], parallel: Any) -> str | None:
        """Rows need the model's ``max_context_length``; PP is no reason here: main's trainer
        builds each microbatch's masks from its own positions."""
        return tt030_folded.check(model, kinds)

    def replace(self, model: nn.Module, kinds: dict[str, str | None]) -> Counter[str]:
        """Swap in the folded replacements."""
        return Counter(tt030_folded.replace(model, kinds))
