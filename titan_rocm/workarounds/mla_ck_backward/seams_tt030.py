"""TorchTitan 0.3.0's seam of MLA attention: inner-attention configs of titan-rocm's own,
swapped in on the built model; the varlen path is 0.2.2's. TorchTitan main's folded tokens
take the same seam with replacements that take ``(T, N, H)`` (:class:`FoldedSeam`, below).

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
  returns (a fresh set per call; TorchTitan's own varlen op is in it): wrapped to add the MLA
  forward ops (a patch of :mod:`titan_rocm.patches`, restored with the job).

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
tokens take the same seam with :data:`FOLDED`.

TorchTitan main's folded tokens on the 0.3.0 API (pytorch/torchtitan b5bcd76c, paths under
``torchtitan/``):



- #4121 (73aed7f6) folds the batch into the token dimension: tokens and ``positions`` are
  ``[T]``, hidden states ``[T, D]``. DeepSeek's ``Attention.forward(x, attention_masks,
  positions)`` (``models/deepseek_v3/model.py:93-151``) views q as ``(T, N, 192)``, builds k
  ``(T, N, 192)`` and v ``(T, N, 128)`` and calls ``inner_attention(q, k, v,
  attention_masks=..., scale=...)`` (``model.py:147-149``).
- The inner attentions take ``(T, N, H)``: ``FlexAttention.forward(q_TNH, k_TNH, v_TNH, *,
  attention_masks: BlockMask, ...)`` adds a kernel batch of 1 at the kernel
  (``models/common/attention.py:313-362``); ``VarlenAttention.forward(q_TNH, k_TNH, v_TNH, *,
  attention_masks: VarlenMetadata, ...)`` hands them to ``varlen_attn`` as they are
  (``attention.py:137-221``). ``ScaledDotProductAttention`` still reads ``(B, L, N, H)``
  (``attention.py:367-426``) and language models refuse it (``models/common/config_utils.py:
  97-101``), so it is not replaced here.
- The masks: ``Decoder.get_attention_masks(positions)`` with ``positions`` ``[T]``
  (``models/common/decoder.py:342-360``) dispatches on the first attention's inner-attention
  config class, as on 0.3.0: a ``(1, T, T)`` ``BlockMask`` for ``FlexAttention.Config``,
  ``create_varlen_metadata_for_document(positions)`` for ``VarlenAttention.Config``
  (``attention.py:576-640``: the document starts, where ``positions`` is 0, then ``T``; the
  longest document by one ``.item()``). The trainer builds them once per batch, and under
  pipeline parallelism once per microbatch from that microbatch's own positions
  (``trainer.py:700-722``, ``804-822``): nothing splits them.
- Tensor parallelism keys the inner attention's sharding config on ``q_TNH``/``k_TNH``/``v_TNH``
  (``models/common/decoder_sharding.py:263-301``); op SAC saves ``_get_default_save_ops()``, as
  on 0.3.0.

The folded seam is the batched one (configs of titan-rocm's own in the model's copy of its
config tree) with replacements that take ``(T, N, H)``. The tokens already are varlen's
``thd`` layout, so both go through aiter's varlen entry points with cumulative sequence
lengths, no packing: :class:`MLAFoldedVarlenAttention` within each document of TorchTitan's
``VarlenMetadata``; :class:`MLAFoldedRowsAttention` (``mla_document_masks = "drop"``) causal
within each ``max_context_length`` row of the tokens (a folded batch of rows of equal length is
varlen with ``cu_seqlens`` at multiples of the row length). The routing is the varlen path's
(:mod:`.routing`, layout ``thd``).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
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

from titan_rocm import patches
from titan_rocm.workarounds.mla_ck_backward.kinds import DENSE, DROPPED, ROWS, VARLEN
from titan_rocm.workarounds.mla_ck_backward.module import MLAInnerAttention, MLAVarlenInnerAttention
from titan_rocm.workarounds.mla_ck_backward.op import FORWARD_OPS

NAME = "mla_ck_backward"
"""Who the seam's patches are ``by``."""

CAUSAL_WINDOW = (-1, 0)
"""``VarlenAttention.Config.window_size`` of causal attention (the only one replaced)."""
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
    patches.patch(module, SAC_FUNCTION, _saving_forward_ops, by=NAME)
    return f"{SAC_MODULE}.{SAC_FUNCTION} (+ the MLA forward ops)"


def _saving_forward_ops(stock: Callable[[], set]) -> Callable[[], set]:
    def save_ops() -> set:
        ops = stock()
        ops.update(FORWARD_OPS)
        return ops

    return save_ops

FOLDED_DOCUMENT_MASKS = (
    "inner_attention configs are VarlenAttention.Config subclasses, so TorchTitan's own "
    "get_attention_masks returns its VarlenMetadata over the folded tokens "
    "(create_varlen_metadata_for_document: a document starts where positions reset to 0), "
    "once per batch (per microbatch under PP) outside the compiled model (host syncs: one "
    "nonzero over the tokens and one for the longest document, as TorchTitan's own varlen "
    "attention)"
)
"""How the plan says where the document boundaries come from on folded tokens."""
ROW_LENGTH = "max_context_length"
"""The model config's property that :class:`MLAFoldedRowsAttention`'s rows are as long as
(main's ``Decoder.Config.max_context_length``, ``models/common/decoder.py:129-137``: the first
attention's RoPE length, which ``update_from_config`` sets to ``training.max_context_length``)."""


def _tokens_first(out: Tensor) -> Tensor:
    """``(1, heads, tokens, dim)`` -> ``(tokens, heads, dim)``, a view."""
    return out.squeeze(0).transpose(0, 1)


def _one_sequence(t: Tensor) -> Tensor:
    """``(tokens, heads, dim)`` -> ``(1, heads, tokens, dim)``, a view: the folded tokens as
    one sequence, which :meth:`~.module.MLAVarlenInnerAttention.within_documents` cuts by
    ``cu_seqlens`` (its packing is then a view again)."""
    return t.transpose(0, 1).unsqueeze(0)


class _Folded(MLAVarlenInnerAttention):
    """Varlen attention over folded ``(T, N, H)`` tokens."""

    def folded(self, q_TNH: Tensor, k_TNH: Tensor, v_TNH: Tensor, cu_seqlens: Tensor,
               max_seqlen: int, scale: float | None, enable_gqa: bool) -> Tensor:
        """Causal attention within each span of ``cu_seqlens`` (int32 starts, then ``T``);
        returns ``(T, N, v head dim)``."""
        out = self.within_documents(_one_sequence(q_TNH), _one_sequence(k_TNH),
                                    _one_sequence(v_TNH), cu_seqlens, max_seqlen,
                                    scale=scale, enable_gqa=enable_gqa)
        return _tokens_first(out)


class MLAFoldedVarlenAttention(Module, _Folded):
    """In place of main's ``VarlenAttention``/``FlexAttention``: aiter's varlen attention,
    causal within each document of the batch's ``VarlenMetadata``."""

    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        """A ``VarlenAttention.Config``: ``Decoder.get_attention_masks`` then returns the
        tokens' ``VarlenMetadata``."""

    def __init__(self, config: Config) -> None:
        # Not VarlenAttention.__init__: it picks a CUDA flash-attention implementation.
        _Folded.__init__(self)
        require_causal(self, config)

    def forward(  # type: ignore[override]
        self,
        q_TNH: Tensor,
        k_TNH: Tensor,
        v_TNH: Tensor,
        *,
        attention_masks: Any,
        scale: float | None = None,
        out_transform: Any = None,
        enable_gqa: bool = False,
        **kwargs: Any,
    ) -> Tensor:
        """Main's ``VarlenAttention`` call; returns ``(tokens, heads, v head dim)``."""
        masks = varlen_metadata(self, attention_masks, out_transform)
        # DeepSeek's self-attention: cu_seq_k is cu_seq_q (create_varlen_metadata_for_document).
        return self.folded(q_TNH, k_TNH, v_TNH, masks.cu_seq_q, masks.max_q, scale, enable_gqa)


def row_offsets(tokens: int, row_length: int, device: torch.device) -> Tensor:
    """int32 ``cu_seqlens`` of ``tokens`` cut into rows of ``row_length`` (the last one may be
    shorter): ``0, L, 2L, ..., tokens``. No host sync."""
    starts = torch.arange(0, tokens + row_length - 1, row_length, dtype=torch.int32,
                          device=device)
    return starts.clamp_(max=tokens)


class MLAFoldedRowsAttention(Module, _Folded):
    """In place of main's ``FlexAttention``/``VarlenAttention`` under ``mla_document_masks =
    "drop"``: aiter's varlen attention, causal within each ``row_length`` row of the tokens,
    across documents; the masks are ignored."""

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        """A ``FlexAttention.Config``: the trainer builds a ``BlockMask``, ignored here."""

        row_length: int = 0
        """Tokens per row: the model's ``max_context_length`` (set by the seam)."""

    def __init__(self, config: Config) -> None:
        _Folded.__init__(self)
        if isinstance(config.row_length, bool) or not isinstance(config.row_length, int) \
                or config.row_length <= 0:
            raise ValueError(f"row_length {config.row_length!r} is not accepted; "
                             "a positive number of tokens (the model's max_context_length)")
        self.row_length = config.row_length

    def forward(  # type: ignore[override]
        self,
        q_TNH: Tensor,
        k_TNH: Tensor,
        v_TNH: Tensor,
        *,
        attention_masks: Any = None,
        scale: float | None = None,
        enable_gqa: bool = False,
        score_mod: Any = None,
        out_transform: Any = None,
        **kwargs: Any,
    ) -> Tensor:
        """Main's ``FlexAttention`` call; returns ``(tokens, heads, v head dim)``."""
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError(f"{type(self).__name__} (rocm.mla_ck_backward) takes "
                                      "neither score_mod nor out_transform; TorchTitan's "
                                      "DeepSeek V3 passes none")
        tokens = q_TNH.shape[0]
        offsets = row_offsets(tokens, self.row_length, q_TNH.device)
        return self.folded(q_TNH, k_TNH, v_TNH, offsets, min(self.row_length, tokens), scale,
                           enable_gqa)


FOLDED = Layout({VARLEN: MLAFoldedVarlenAttention, ROWS: MLAFoldedRowsAttention},
                      dropped=ROWS, sdpa=None)
"""Main's ``(T, N, H)``: per-document and dropped masks both varlen; SDPA not replaced."""


def row_length(model: nn.Module) -> int | None:
    """The model's ``max_context_length`` (None: its config has none)."""
    value = getattr(getattr(model, "config", None), ROW_LENGTH, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def check_folded(model: nn.Module, kinds: dict[str, str | None]) -> str | None:
    """Why ``model``'s attention cannot take the folded replacements (None: it can)."""
    if ROWS in kinds.values() and row_length(model) is None:
        return (f"mla_document_masks = \"drop\" on folded tokens cuts them into rows of the "
                f"model's {ROW_LENGTH}, and model.config has none")
    return check(model, kinds)


def replace_folded(model: nn.Module, kinds: dict[str, str | None]) -> dict[str, int]:
    """:func:`replace` with the folded replacements (rows as long as the model's
    ``max_context_length``)."""
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
    """:class:`~.workaround.MLASeam` for TorchTitan main, whose batch is folded into the token
    dimension (pytorch/torchtitan #4121): q/k/v ``(T, N, H)``, both mask kinds through aiter's
    varlen entry points."""

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
