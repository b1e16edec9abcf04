"""DeepSeek MLA attention on aiter, each call routed by the device's real arch and the installed
aiter release; per-document (block_causal) masks through aiter's varlen kernels.

The converter ``rocm.mla_ck_backward`` replaces each DeepSeek V3 block's
``attention.inner_attention``: :class:`~.module.MLAInnerAttention` (causal) or
:class:`~.module.MLAVarlenInnerAttention` (per document, reading the
:class:`~.documents.DocumentSpans` the model's ``get_attention_masks`` now returns). Both
directions are chosen per call by :func:`~.routing.route_forward` /
:func:`~.routing.route_backward`: aiter's own dispatch, or its CK kernel called directly where
aiter would mis-dispatch q/k 192, v 128 (gfx942's backward; a forward whose fmha_v3 kernel the
device lacks when aiter's ``get_gfx()`` names another arch). v is never padded. :mod:`~.guard`
routes other callers of aiter's ``_flash_attn_backward`` the same way. Docs:
docs/mla-ck-backward.md.

On TorchTitan 0.3.0, :mod:`~.seams_tt030` swaps in inner-attention configs of titan-rocm's own
(the varlen one a ``VarlenAttention.Config``, so TorchTitan's own ``get_attention_masks``
returns the document boundaries) whose modules run the same varlen and dense paths: one
module per q/k/v layout, :mod:`~.batched_tt030` (0.3.0's ``(batch, seqlen, heads, dim)``) and
:mod:`~.folded_tt030` (TorchTitan main's folded ``(T, N, H)``).

Modules: ``aiter_releases`` (the per-release facts), ``routing`` (the pure decision),
``aiter_api`` (lazy aiter access), ``op`` (the torch.library custom ops), ``documents`` (the
per-document spans), ``kinds`` (the attention kinds, a layout's replacements), ``module`` (the
replacement inner attentions), ``seams_tt022`` and ``seams_tt030`` (each TorchTitan
generation's seam), ``batched_tt030`` and ``folded_tt030`` (0.3.0's replacements per layout),
``guard`` (the patch of aiter's own backward), ``route_log``, ``workaround`` (the gated
converter step).
"""
