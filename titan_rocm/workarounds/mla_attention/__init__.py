"""DeepSeek MLA attention on aiter, with the backward for q/k 192, v 128 routed to CK on gfx942.

The converter ``rocm.mla_ck_backward`` replaces each DeepSeek V3 block's
``attention.inner_attention`` with :class:`~.module.MLAInnerAttention`: aiter's flash
attention forward, and a backward chosen per call by :func:`~.routing.route_backward`.
On an architecture whose aiter fmha_v3 ASM backward lacks the q/k 192 / v 128 shape
(gfx942, see :mod:`titan_rocm.archs`), that shape goes straight to aiter's generic CK
``mha_bwd``; v is never padded. :mod:`~.guard` routes other callers of aiter's
``_flash_attn_backward`` the same way. Docs: docs/mla-ck-backward.md.

Modules: ``routing`` (the pure decision), ``aiter_api`` (lazy aiter access), ``op`` (the
torch.library custom ops), ``module`` (the replacement inner attention), ``guard`` (the
patch of aiter's own backward), ``workaround`` (the gated converter step).
"""
