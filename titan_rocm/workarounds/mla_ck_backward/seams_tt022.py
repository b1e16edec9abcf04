"""TorchTitan 0.2.2's seam of MLA attention: DeepSeek's inner wrappers swapped for :mod:`.module`'s,
and the forward ops added to ``_op_sac_save_list`` (read at each call)."""

from __future__ import annotations

import importlib
from collections import Counter
from typing import Any

import torch.nn as nn

from titan_rocm import patches
from titan_rocm.workarounds.base import Context
from titan_rocm.workarounds.mla_ck_backward.kinds import DENSE, DROPPED, FLEX_CAUSAL, VARLEN

NAME = "mla_ck_backward"
"""Who the seam's patches are ``by``."""
DEEPSEEK_PARALLELIZE = "torchtitan.models.deepseek_v3.infra.parallelize"
SAC_LIST_NAME = "_op_sac_save_list"
DOCUMENT_MASKS = (
    "get_attention_masks returns DocumentSpans: cu_seqlens from TorchTitan's "
    "create_varlen_metadata_for_document, once per batch outside the compiled model "
    "(host syncs: a few per sample and one for the longest document, as "
    "TorchTitan's own varlen attention)"
)
"""How the plan says where the document boundaries come from on 0.2.2."""


def deepseek_attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(fqn, module)`` of every TorchTitan DeepSeek V3 MLA ``Attention`` in ``model``."""
    from torchtitan.models.deepseek_v3.model.model import Attention

    return [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, Attention)]


def mask_type(model: nn.Module) -> str:
    """The model's ``attn_mask_type`` (``causal`` or ``block_causal``); ``causal`` if unset."""
    return str(getattr(getattr(model, "model_args", None), "attn_mask_type", "causal"))


def attention_kind(attention: nn.Module, masks: str, drop_documents: bool) -> str | None:
    """Which of :data:`ATTENTION_LABELS` ``attention`` gets (it may already have it); None
    for an inner attention titan-rocm does not replace."""
    from torchtitan.models.attention import FlexAttentionWrapper, ScaledDotProductAttentionWrapper

    from titan_rocm.workarounds.mla_ck_backward.module import (
        MLAFlexInnerAttention,
        MLAInnerAttention,
        MLAVarlenInnerAttention,
    )

    inner = attention.inner_attention
    if isinstance(inner, MLAVarlenInnerAttention):
        return VARLEN
    if isinstance(inner, (FlexAttentionWrapper, MLAFlexInnerAttention)):
        if masks == "causal":
            return FLEX_CAUSAL
        return DROPPED if drop_documents else VARLEN
    if isinstance(inner, (ScaledDotProductAttentionWrapper, MLAInnerAttention)):
        return DENSE
    return None


def replacement(kind: str) -> type[nn.Module]:
    """The inner-attention class of ``kind``."""
    from titan_rocm.workarounds.mla_ck_backward.module import (
        MLAFlexInnerAttention,
        MLAInnerAttention,
        MLAVarlenInnerAttention,
    )

    return {DENSE: MLAInnerAttention, FLEX_CAUSAL: MLAFlexInnerAttention,
            VARLEN: MLAVarlenInnerAttention, DROPPED: MLAFlexInnerAttention}[kind]


def expected_attention_dtype(ctx: Context) -> str:
    """The dtype DeepSeek's q/k/v will have in a TorchTitan 0.2.2 job (bf16, or mixed precision
    through FSDP or autocast; float32 under TP/PP without FSDP)."""
    if ctx.training_dtype == "bfloat16":
        return "bfloat16"
    parallel = ctx.parallel
    if parallel.fsdp_enabled or not (parallel.tp_enabled or parallel.pp_enabled):
        return ctx.mixed_precision_param
    return "float32"


PP_REASON = (
    "block_causal (per-document) masks under pipeline parallelism: PP splits "
    "the masks per microbatch into plain BlockMasks, without titan-rocm's "
    'document spans; turn PP off, or set [rocm] mla_document_masks = "drop" '
    "(causal attention across documents)"
)


class Seam:
    """:class:`~.workaround.MLASeam` for TorchTitan 0.2.2."""

    stock = "TorchTitan's SDPA and flex attention wrappers"
    document_masks = DOCUMENT_MASKS

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """Every DeepSeek V3 ``Attention``."""
        return deepseek_attention_modules(model)

    def kinds(self, model: nn.Module, drop_documents: bool) -> dict[str, str | None]:
        """Each attention's kind, by its wrapper and the model's mask type."""
        masks = mask_type(model)
        return {fqn: attention_kind(m, masks, drop_documents)
                for fqn, m in deepseek_attention_modules(model)}

    def check(self, model: nn.Module, kinds: dict[str, str | None], parallel: Any) -> str | None:
        """Per-document masks need no PP and a ``get_attention_masks`` to replace."""
        if VARLEN in kinds.values():
            if parallel.pp_enabled:
                return PP_REASON
            if not callable(getattr(model, "get_attention_masks", None)):
                return "block_causal masks, but the model has no get_attention_masks to replace"
        return None

    def masks(self, model: nn.Module) -> str:
        """The model's ``attn_mask_type``."""
        return mask_type(model)

    def replace(self, model: nn.Module, kinds: dict[str, str | None]) -> Counter[str]:
        """Swap the wrappers; per-document masks become DocumentSpans."""
        from titan_rocm.workarounds.mla_ck_backward import documents

        replaced: Counter[str] = Counter()
        attentions = dict(deepseek_attention_modules(model))
        for fqn, kind in kinds.items():
            attention = attentions[fqn]
            cls = replacement(kind) if kind else None
            if cls is None or type(attention.inner_attention) is cls:
                continue
            inner = attention.inner_attention
            attention.inner_attention = cls(getattr(inner, "sdpa_backends", None))
            replaced[kind] += 1
        if VARLEN in kinds.values():  # a swapped module keeps its kind
            documents.install(model)
        return replaced

    def save_forward_in_op_sac(self) -> str | None:
        """Add the forward ops to ``_op_sac_save_list`` of the parallelize module(s) found."""
        from titan_rocm.workarounds.mla_ck_backward.op import FORWARD_OPS

        found: list[str] = []
        for module_name in self._parallelize_modules():
            try:
                module = importlib.import_module(module_name)
            except Exception:  # an optional model module that cannot load
                continue
            if isinstance(getattr(module, SAC_LIST_NAME, None), set):
                patches.patch(module, SAC_LIST_NAME, lambda stock: stock | set(FORWARD_OPS),
                              by=NAME)
                found.append(f"{module_name}.{SAC_LIST_NAME}")
        return ", ".join(found) or None

    def _parallelize_modules(self) -> list[str]:
        names: list[str] = []
        if self.ctx.parallelize_fn is not None:
            names.append(self.ctx.parallelize_fn.__module__)
        if DEEPSEEK_PARALLELIZE not in names:
            names.append(DEEPSEEK_PARALLELIZE)
        return names

    def attention_dtype(self) -> str:
        """As TorchTitan 0.2.2 sets it up (:func:`expected_attention_dtype`)."""
        return expected_attention_dtype(self.ctx)

    def machine_facts_when_skipped(self, model: nn.Module) -> bool:
        """A DeepSeek model that was skipped still shows what the machine has."""
        return bool(deepseek_attention_modules(model))
