"""TorchTitan 0.3.0's seam of MLA attention: inner-attention modules of titan-rocm's own, swapped in
on the meta model (docs/mla-ck-backward.md, "TorchTitan 0.3.0").

Swapping before ``parallelize_fn`` lets the stock code shard, checkpoint and compile the blocks with
the replacements in them; each ``Config`` subclasses the stock one so ``get_attention_masks`` builds
the masks it needs."""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch.nn as nn
from torchtitan.models.common.attention import (
    FlexAttention,
    ScaledDotProductAttention,
    VarlenAttention,
)
from torchtitan.models.deepseek_v3.model import Attention

from titan_rocm import patches
from titan_rocm.workarounds.mla_ck_backward.batched_tt030 import BATCHED, CAUSAL_WINDOW
from titan_rocm.workarounds.mla_ck_backward.folded_tt030 import (
    FOLDED,
    FOLDED_DOCUMENT_MASKS,
    ROW_LENGTH,
    row_length,
)
from titan_rocm.workarounds.mla_ck_backward.kinds import ROWS, VARLEN, Layout
from titan_rocm.workarounds.mla_ck_backward.op import FORWARD_OPS

NAME = "mla_ck_backward"
"""Who the seam's patches are ``by``."""

SAC_MODULE = "torchtitan.distributed.activation_checkpoint"
SAC_FUNCTION = "_get_default_save_ops"
DOCUMENT_MASKS = (
    "inner_attention configs are VarlenAttention.Config subclasses, so TorchTitan's own "
    "get_attention_masks returns its VarlenMetadata (create_varlen_metadata_for_document: a "
    "document starts where positions reset to 0), once per batch outside the compiled model "
    "(host syncs: one per sample and one for the longest document, as TorchTitan's own "
    "varlen attention)"
)
"""How the plan says where the document boundaries come from on 0.3.0."""
PP_REASON = (
    "per-document masks under pipeline parallelism: PP splits the batch's masks per "
    "microbatch, and it cuts TorchTitan 0.3.0's VarlenMetadata (the document offsets of the "
    "whole batch in one tensor) as a tensor, not per sample; turn PP off, or set [rocm] "
    'mla_document_masks = "drop" (causal attention across documents)'
)
"""Why the varlen path refuses pipeline parallelism on 0.3.0."""


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(fqn, module)`` of every TorchTitan 0.3.0 DeepSeek V3 MLA ``Attention`` in ``model``."""
    return [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, Attention)]


def attention_kind(attention: nn.Module, drop_documents: bool,
                   layout: Layout = BATCHED) -> str | None:
    """Which kind ``attention``'s inner attention gets (it may have it already); None for
    one titan-rocm does not replace."""
    inner = attention.inner_attention
    for kind, cls in layout.replacements.items():
        if type(inner) is cls:
            return kind
    causal_varlen = (isinstance(inner, VarlenAttention)
                     and tuple(inner.window_size) == CAUSAL_WINDOW)
    if isinstance(inner, FlexAttention) or causal_varlen:
        return layout.dropped if drop_documents else VARLEN
    if isinstance(inner, ScaledDotProductAttention):
        return layout.sdpa
    return None


def _attention_configs(model: nn.Module) -> dict[str, Any]:
    config = getattr(model, "config", None)
    if not callable(getattr(config, "traverse", None)):
        return {}
    return {fqn: cfg for fqn, cfg, _parent, _attr in config.traverse(Attention.Config)}


def check(model: nn.Module, kinds: dict[str, str | None]) -> str | None:
    """Why ``model``'s masks cannot follow its replaced attention (None: they can)."""
    configs = _attention_configs(model)
    missing = sorted(fqn for fqn, kind in kinds.items() if kind and fqn not in configs)
    if missing:
        return (f"DeepSeek attention {', '.join(missing[:3])} has no Attention.Config at that "
                "name in the model's config tree (model.config), which decides its masks")
    return None


def _config_of(cls: type, stock: Any, fields: Mapping[str, Any]) -> Any:
    """Config ``cls`` with the fields it shares with ``stock`` (sharding and parameter init,
    Flex's block size and kernel options, Varlen's window), then ``fields``."""
    shared = {f.name: getattr(stock, f.name) for f in dataclasses.fields(cls)
              if f.init and hasattr(stock, f.name)}
    return cls(**{**shared, **fields})


def replace(model: nn.Module, kinds: dict[str, str | None], layout: Layout = BATCHED,
            fields: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, int]:
    """Swap each inner attention for its kind's replacement; return how many of each kind."""
    config = copy.deepcopy(model.config)  # the model's copy; the trainer's stays as built
    configs = {fqn: cfg for fqn, cfg, _p, _a in config.traverse(Attention.Config)}
    attentions = dict(attention_modules(model))
    replaced: dict[str, int] = {}
    for fqn, kind in kinds.items():
        attention = attentions[fqn]
        if kind is None or type(attention.inner_attention) is layout.replacements[kind]:
            continue
        node = configs[fqn]
        node.inner_attention = _config_of(layout.replacements[kind].Config,
                                          node.inner_attention, (fields or {}).get(kind, {}))
        inner = node.inner_attention.build()
        backends = getattr(attention.inner_attention, "sdpa_backends", None)
        if backends:  # the stock SDPA's, for the fallback
            inner.sdpa_backends = list(backends)
        attention.inner_attention = inner
        replaced[kind] = replaced.get(kind, 0) + 1
    model.config = config
    return replaced


def attention_dtype(training_dtype: str, mixed_precision_param: str) -> str:
    """The dtype DeepSeek's q/k/v have in a 0.3.0 job: bf16, else mixed precision, which 0.3.0's
    DeepSeek ``parallelize_fn`` always applies (its ``fsdp`` mesh exists even at size 1)."""
    return "bfloat16" if training_dtype == "bfloat16" else mixed_precision_param


def save_forward_in_op_sac() -> str:
    """Make op-level SAC save the MLA forward ops too (idempotent, process-wide); returns what
    changed."""
    module = importlib.import_module(SAC_MODULE)
    patches.patch(module, SAC_FUNCTION, _saving_forward_ops, by=NAME)
    return f"{SAC_MODULE}.{SAC_FUNCTION} (+ the MLA forward ops)"


def _saving_forward_ops(stock: Callable[[], set]) -> Callable[[], set]:
    def save_ops() -> set:
        ops = stock()
        ops.update(FORWARD_OPS)
        return ops

    return save_ops

def check_folded(model: nn.Module, kinds: dict[str, str | None]) -> str | None:
    """Why ``model``'s attention cannot take the folded replacements (None: it can)."""
    if ROWS in kinds.values() and row_length(model) is None:
        return (f"mla_document_masks = \"drop\" on folded tokens cuts them into rows of the "
                f"model's {ROW_LENGTH}, and model.config has none")
    return check(model, kinds)


def replace_folded(model: nn.Module, kinds: dict[str, str | None]) -> dict[str, int]:
    """:func:`replace` with the folded replacements."""
    return replace(model, kinds, FOLDED, {ROWS: {"row_length": row_length(model)}})


class Seam:
    """:class:`~.workaround.MLASeam` for TorchTitan 0.3.0."""

    stock = "TorchTitan's ScaledDotProductAttention, FlexAttention and causal VarlenAttention"
    document_masks = DOCUMENT_MASKS

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """Every 0.3.0 DeepSeek V3 ``Attention``."""
        return attention_modules(model)

    layout = BATCHED
    """The replacement of each kind."""

    def kinds(self, model: nn.Module, drop_documents: bool) -> dict[str, str | None]:
        """Each attention's kind, by its inner attention's class."""
        return {fqn: attention_kind(m, drop_documents, self.layout)
                for fqn, m in attention_modules(model)}

    def check(self, model: nn.Module, kinds: dict[str, str | None], parallel: Any) -> str | None:
        """Per-document masks need no PP; every replaced attention needs its config."""
        if VARLEN in kinds.values() and parallel.pp_enabled:
            return PP_REASON
        return check(model, kinds)

    def masks(self, model: nn.Module) -> str:
        """0.3.0 drops only per-document masks."""
        return "block_causal"

    def replace(self, model: nn.Module, kinds: dict[str, str | None]) -> Counter[str]:
        """Swap the inner-attention configs and modules."""
        return Counter(replace(model, kinds))

    def save_forward_in_op_sac(self) -> str | None:
        """``_get_default_save_ops`` returns the forward ops too."""
        return save_forward_in_op_sac()

    def attention_dtype(self) -> str:
        """As 0.3.0's DeepSeek ``parallelize_fn`` sets it up."""
        return attention_dtype(self.ctx.training_dtype, self.ctx.mixed_precision_param)

    def machine_facts_when_skipped(self, model: nn.Module) -> bool:
        """A skipped 0.3.0 plan shows nothing (as before the seams)."""
        return False


class FoldedSeam(Seam):
    """:class:`~.workaround.MLASeam` for TorchTitan main's folded ``(T, N, H)`` tokens
    (pytorch/torchtitan #4121)."""

    stock = ("TorchTitan's FlexAttention and causal VarlenAttention (on folded (T, N, H) "
             "tokens, where language models refuse ScaledDotProductAttention)")
    document_masks = FOLDED_DOCUMENT_MASKS
    layout = FOLDED

    def check(self, model: nn.Module, kinds: dict[str, str | None], parallel: Any) -> str | None:
        """Rows need the model's ``max_context_length``; PP is no reason here: main's trainer
        builds each microbatch's masks from its own positions."""
        return check_folded(model, kinds)

    def replace(self, model: nn.Module, kinds: dict[str, str | None]) -> Counter[str]:
        """Swap in the folded replacements."""
        return Counter(replace_folded(model, kinds))
