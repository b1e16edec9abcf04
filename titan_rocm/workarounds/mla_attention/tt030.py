"""TorchTitan 0.3.0's seam for MLA on aiter: inner-attention configs of titan-rocm's own,
swapped in on the built model; the varlen path is 0.2.2's.

What 0.3.0 has (paths under ``torchtitan/``):

- DeepSeek's ``Attention`` (``models/deepseek_v3/model.py``) builds ``inner_attention`` from
  its config (``Attention.Config.inner_attention``, ``FlexAttention.Config`` by default;
  ``VarlenAttention.Config`` with ``attn_backend="varlen"``; ``sdpa`` is refused for language
  models, ``models/common/config_utils.py``) and calls it with ``(q, k, v,
  attention_masks=..., scale=...)``, tensors ``(batch, seqlen, heads, dim)``.
- The masks are per document: ``Decoder.get_attention_masks(positions)``
  (``models/common/decoder.py``) dispatches on the *config class* of the first attention's
  ``inner_attention``: a ``BlockMask`` for ``FlexAttention.Config``, ``VarlenMetadata`` from
  ``create_varlen_metadata_for_document(positions)`` (a document starts where ``positions``
  resets to 0) for ``VarlenAttention.Config``. The trainer (``post_dataloading_process``) and
  the validator call it once per batch, outside the compiled model.
- Tensor parallelism is a ``sharding_config`` on the inner attention's config, copied to the
  module at build (``protocols/module.py``) and keyed on ``forward``'s positional argument
  names ``q_BLNH``/``k_BLNH``/``v_BLNH`` (``set_gqa_inner_attention_local_map``).
- Op-level SAC saves what ``distributed/activation_checkpoint.py``'s ``_get_default_save_ops()``
  returns (a fresh set per call; TorchTitan's own varlen op is in it).

The seam: each replacement is a TorchTitan ``Module`` whose ``Config`` subclasses the config
class that makes TorchTitan build the masks it needs (:class:`MLAVarlenAttention`:
``VarlenAttention.Config``, so ``get_attention_masks`` returns TorchTitan's own
``VarlenMetadata``; the dense ones: ``ScaledDotProductAttention.Config``, no masks, or
``FlexAttention.Config``, masks dropped) and whose ``forward`` has the stock argument names.
The workaround decides on the built model (meta device, before ``parallelize_fn``): it builds
each replacement from such a config carrying the stock one's fields (the sharding config
among them), swaps it in, and puts the configs into the model's own copy of its config tree
(the trainer's config tree stays as the user built it; the trainer dispatches Flex and Varlen
configs alike to ``model.get_attention_masks``). Then the stock ``parallelize_fn`` shards,
checkpoints and compiles the blocks with the replacements in them. The work itself is
0.2.2's: :meth:`~.module.MLAVarlenInnerAttention.within_documents` (packing, the varlen ops,
routing, fallbacks) and :class:`~.module.MLAInnerAttention` (dense). Which replacement each
kind gets is a :class:`Layout`: :data:`BATCHED` here; TorchTitan main's folded ``(T, N, H)``
tokens take the same seam with :data:`~.tt030_folded.FOLDED`.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch.nn as nn
from torch import Tensor
from torchtitan.models.common.attention import (
    FlexAttention,
    ScaledDotProductAttention,
    VarlenAttention,
    VarlenMetadata,
)
from torchtitan.models.deepseek_v3.model import Attention
from torchtitan.protocols.module import Module

from titan_rocm.workarounds.mla_attention.kinds import DENSE, DROPPED, VARLEN
from titan_rocm.workarounds.mla_attention.module import MLAInnerAttention, MLAVarlenInnerAttention
from titan_rocm.workarounds.mla_attention.op import FORWARD_OPS

CAUSAL_WINDOW = (-1, 0)
"""``VarlenAttention.Config.window_size`` of causal attention (the only one replaced)."""
SAC_MODULE = "torchtitan.distributed.activation_checkpoint"
SAC_FUNCTION = "_get_default_save_ops"
_SAC_ORIGINAL = "_titan_rocm_original"
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


class MLAVarlenAttention(Module, MLAVarlenInnerAttention):
    """In place of ``VarlenAttention``/``FlexAttention``: aiter's varlen attention, causal
    within each document of the batch's ``VarlenMetadata``."""

    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        """A ``VarlenAttention.Config``: ``Decoder.get_attention_masks`` then returns the
        batch's ``VarlenMetadata``."""

    def __init__(self, config: Config) -> None:
        # Not VarlenAttention.__init__: it picks a CUDA flash-attention implementation.
        MLAVarlenInnerAttention.__init__(self)
        require_causal(self, config)

    def forward(  # type: ignore[override]
        self,
        q_BLNH: Tensor,
        k_BLNH: Tensor,
        v_BLNH: Tensor,
        *,
        attention_masks: Any,
        scale: float | None = None,
        out_transform: Any = None,
        enable_gqa: bool = False,
        **kwargs: Any,
    ) -> Tensor:
        """``VarlenAttention``'s call; returns ``(batch, seqlen, heads, v head dim)``."""
        masks = varlen_metadata(self, attention_masks, out_transform)
        # DeepSeek's self-attention: cu_seq_k is cu_seq_q (create_varlen_metadata_for_document).
        out = self.within_documents(
            q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
            masks.cu_seq_q, masks.max_q, scale=scale, enable_gqa=enable_gqa,
        )
        return out.transpose(1, 2)


def require_causal(module: nn.Module, config: Any) -> None:
    """Refuse a varlen config whose window is not causal (the only one replaced)."""
    if tuple(config.window_size) != CAUSAL_WINDOW:
        raise ValueError(f"window_size {config.window_size} is not accepted; "
                         f"{type(module).__name__} is causal: {CAUSAL_WINDOW}")


def varlen_metadata(module: nn.Module, attention_masks: Any, out_transform: Any) -> Any:
    """``attention_masks`` as the ``VarlenMetadata`` a varlen replacement reads.

    Raises:
        NotImplementedError: an ``out_transform`` (DeepSeek passes none).
        TypeError: the masks are not TorchTitan's ``VarlenMetadata``.
    """
    if out_transform is not None:
        raise NotImplementedError(f"{type(module).__name__} (rocm.mla_ck_backward) does not "
                                  "take out_transform; TorchTitan's DeepSeek V3 passes none")
    if not isinstance(attention_masks, VarlenMetadata):
        raise TypeError(f"attention_masks must be TorchTitan's VarlenMetadata, got "
                        f"{type(attention_masks).__name__}")
    return attention_masks


class MLASdpaAttention(Module, MLAInnerAttention):
    """In place of ``ScaledDotProductAttention``: aiter dense attention (no masks)."""

    ignores_masks: ClassVar[bool] = False
    """Masks are refused, as ``ScaledDotProductAttention`` refuses them."""

    @dataclass(kw_only=True, slots=True)
    class Config(ScaledDotProductAttention.Config):
        """A ``ScaledDotProductAttention.Config``: the trainer builds no masks for it."""

    def __init__(self, config: Any) -> None:
        MLAInnerAttention.__init__(self)

    def forward(  # type: ignore[override]
        self,
        q_BLNH: Tensor,
        k_BLNH: Tensor,
        v_BLNH: Tensor,
        *,
        attention_masks: Any = None,
        scale: float | None = None,
        enable_gqa: bool = False,
        is_causal: bool = True,
        **kwargs: Any,
    ) -> Tensor:
        """``ScaledDotProductAttention``'s call (``FlexAttention``'s, when masks are ignored)."""
        if attention_masks is not None and not self.ignores_masks:
            raise ValueError(f"{type(self).__name__} takes no attention_masks")
        out = MLAInnerAttention.forward(self, q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2),
                                        v_BLNH.transpose(1, 2), scale=scale,
                                        enable_gqa=enable_gqa, is_causal=is_causal)
        return out.transpose(1, 2)


class MLADroppedMasksAttention(MLASdpaAttention):
    """In place of ``FlexAttention``/``VarlenAttention`` under ``mla_document_masks = "drop"``:
    aiter dense causal attention across documents; the masks are ignored."""

    ignores_masks = True

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        """A ``FlexAttention.Config``: the trainer builds a ``BlockMask`` (which pipeline
        parallelism splits per microbatch), ignored here."""


@dataclass(frozen=True)
class Layout:
    """The replacements of one q/k/v layout of the 0.3.0 API: which module each attention
    kind gets, and which kinds dropped masks and stock SDPA become."""

    replacements: Mapping[str, type[Module]]
    dropped: str
    """The kind of per-document attention under ``mla_document_masks = "drop"``."""
    sdpa: str | None
    """The kind stock ``ScaledDotProductAttention`` gets; None: left as it is."""


BATCHED = Layout({VARLEN: MLAVarlenAttention, DENSE: MLASdpaAttention,
                  DROPPED: MLADroppedMasksAttention}, dropped=DROPPED, sdpa=DENSE)
"""TorchTitan 0.3.0's ``(batch, seqlen, heads, dim)`` (there is no causal-only Flex mask)."""


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
    """Swap each attention's inner attention for the replacement of its kind, built from a
    config (with ``fields[kind]`` set) that then stands in the model's own copy of its config
    tree. Returns how many of each kind were swapped (one already replaced is left as it
    is)."""
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
    """The dtype DeepSeek's q/k/v have in a 0.3.0 job: ``training.dtype = "bfloat16"`` keeps
    everything bf16; otherwise mixed precision, which 0.3.0's DeepSeek ``parallelize_fn``
    always applies (``fully_shard``: its ``fsdp`` mesh exists even at size 1)."""
    return "bfloat16" if training_dtype == "bfloat16" else mixed_precision_param


def save_forward_in_op_sac() -> str:
    """Make op-level SAC save the MLA forward ops: ``_get_default_save_ops`` returns them too
    (idempotent, process-wide; the ops appear only where titan-rocm's attention runs).
    Returns what was changed, for the log and the plan."""
    module = importlib.import_module(SAC_MODULE)
    current = getattr(module, SAC_FUNCTION)
    if getattr(current, _SAC_ORIGINAL, None) is None:
        def save_ops() -> set:
            ops = current()
            ops.update(FORWARD_OPS)
            return ops

        setattr(save_ops, _SAC_ORIGINAL, current)
        setattr(module, SAC_FUNCTION, save_ops)
    return f"{SAC_MODULE}.{SAC_FUNCTION} (+ the MLA forward ops)"


def restore_op_sac() -> None:
    """Undo :func:`save_forward_in_op_sac` (tests)."""
    module = importlib.import_module(SAC_MODULE)
    original = getattr(getattr(module, SAC_FUNCTION), _SAC_ORIGINAL, None)
    if original is not None:
        setattr(module, SAC_FUNCTION, original)
