"""A stand-in for TorchTitan main's DeepSeek V3 attention over folded tokens, built on TorchTitan
0.3.0's classes, so the 0.3.0 suite (CI has no TorchTitan main) runs titan-rocm's folded seam
on main's shapes.

Copied, in its own words, from pytorch/torchtitan b5bcd76c (the newest commit read; #4121,
73aed7f6, folded the batch into the token dimension):

- ``torchtitan/models/deepseek_v3/model.py:93-151``, ``Attention.forward(x, attention_masks,
  positions=None)``: ``x`` is ``(T, D)``; q is viewed ``(T, N, qk_head_dim)``, RoPE is applied
  to ``q_pe`` ``(T, N, 64)`` and ``k_pe.unsqueeze(1)`` ``(T, 1, 64)`` with ``positions`` ``[T]``,
  k is ``(T, N, 192)``, v ``(T, N, 128)``; then ``inner_attention(q, k, v,
  attention_masks=attention_masks, scale=self.softmax_scale)``, ``.contiguous()``, viewed
  ``(T, N * 128)``, ``wo``. 0.3.0's RoPE reads ``(B, L, N, H)`` and ``positions`` ``(B, L)``:
  the stand-in applies it to a batch of one, which is main's RoPE on ``[T]`` positions.
- ``torchtitan/models/common/attention.py``: ``FlexAttention.forward(q_TNH, k_TNH, v_TNH, *,
  attention_masks: BlockMask, score_mod=None, scale=None, enable_gqa=False,
  out_transform=None, **kwargs)`` (313-362) runs flex attention on ``(1, N, T, H)`` and returns
  ``(T, N, H)``; ``VarlenAttention.forward(q_TNH, k_TNH, v_TNH, *, attention_masks:
  VarlenMetadata, scale=None, out_transform=None, **kwargs)`` (137-221) calls CUDA's
  ``varlen_attn``, which the CPU has not: the stand-in computes the same attention with SDPA
  under the per-document mask; ``create_varlen_metadata_for_document(positions)`` (576-640)
  and ``get_efficient_causal_mask_mod_for_packed_document(positions)`` (468-508) over
  ``positions`` ``[T]``.
- ``torchtitan/models/common/decoder.py``: ``Decoder.get_attention_masks(positions)``
  (342-360) dispatches on the first attention's inner-attention config class (a ``(1, T, T)``
  ``BlockMask`` of causal AND packed-document masks, ``_create_flex_attention_mask``, 301-325;
  or ``VarlenMetadata``); ``Decoder.Config.max_context_length`` (129-137) is the first
  attention's RoPE length.
- ``torchtitan/models/common/decoder_sharding.py:263-301``: the inner attention's sharding
  config is keyed ``q_TNH``/``k_TNH``/``v_TNH``; the stand-in renames 0.3.0's keys to those
  (placements stay 0.3.0's: no TP runs on CPU).
- ``torchtitan/models/deepseek_v3/config_registry.py:39-73``, ``deepseek_v3_debugmodel``: 8 x
  2048 tokens per microbatch, ``max_context_length`` 2048.

Every stand-in class subclasses its 0.3.0 namesake (the names, configs and mask dispatch the
seam reads are the same on main) and overrides what #4121 changed. The tests built on it also
run against TorchTitan main itself where that is installed (``main_attention()``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import and_masks, create_block_mask
from torchtitan.models.common import attention as tt_attention
from torchtitan.models.deepseek_v3 import model as tt_deepseek

from titan_rocm import torchtitan_version

MAIN_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
"""The pytorch/torchtitan commit this stand-in copies."""
SHARDING_NAMES = {"q_BLNH": "q_TNH", "k_BLNH": "k_TNH", "v_BLNH": "v_TNH"}
"""0.3.0's sharding keys -> main's (``decoder_sharding.py:287-297``)."""
VarlenMetadata = tt_attention.VarlenMetadata


def create_varlen_metadata_for_document(positions: torch.Tensor) -> Any:
    """Main's document boundaries of ``positions`` ``[T]``: every start (position 0), then
    ``T``; the longest document."""
    starts = (positions == 0).nonzero(as_tuple=True)[0].to(torch.int32)
    end = torch.tensor([positions.shape[0]], dtype=torch.int32, device=positions.device)
    offsets = torch.cat([starts, end])
    lengths = torch.diff(offsets)
    longest = int(lengths.max().item()) if lengths.numel() else 0
    return VarlenMetadata(cu_seq_q=offsets, cu_seq_k=offsets, max_q=longest, max_k=longest)


def packed_document_mask_mod(positions: torch.Tensor) -> Any:
    """Main's lower bound of causal packed-document masking: a key at or after the start of
    the query's document (the causal mask gives the upper bound)."""
    tokens = positions.shape[0]
    starts = positions == 0
    document = torch.cumsum(starts.int(), dim=0).to(torch.int32) - 1
    index = torch.arange(tokens, dtype=torch.int32, device=positions.device)
    first = torch.full((tokens + 1,), tokens, dtype=torch.int32, device=positions.device)
    first.scatter_(0, document[starts].to(torch.int64), index[starts])

    def mask(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
             kv_idx: torch.Tensor) -> torch.Tensor:
        return kv_idx >= first[document[q_idx]]

    return mask


def _causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
            kv_idx: torch.Tensor) -> torch.Tensor:
    return q_idx >= kv_idx


def evaluated(block_mask: Any, tokens: int) -> torch.Tensor:
    """``(1, 1, T, T)``: a ``BlockMask``'s own ``mask_mod`` over every (query, key)."""
    i = torch.arange(tokens)[:, None]
    j = torch.arange(tokens)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    return block_mask.mask_mod(zero, zero, i, j)[None, None]


def sdpa_tokens(q_TNH: torch.Tensor, k_TNH: torch.Tensor, v_TNH: torch.Tensor,
                mask: torch.Tensor, scale: float | None) -> torch.Tensor:
    """SDPA of ``(T, N, H)`` tensors under a ``(1, 1, T, T)`` bool mask, ``(T, N, H)`` out."""
    out = F.scaled_dot_product_attention(*(t.transpose(0, 1).unsqueeze(0)
                                           for t in (q_TNH, k_TNH, v_TNH)),
                                         attn_mask=mask, scale=scale)
    return out.squeeze(0).transpose(0, 1)


class FlexAttention(tt_attention.FlexAttention):
    """Main's ``FlexAttention``: ``(T, N, H)`` in and out, a kernel batch of one."""

    @dataclass(kw_only=True, slots=True)
    class Config(tt_attention.FlexAttention.Config):
        pass

    def forward(self, q_TNH, k_TNH, v_TNH, *, attention_masks, score_mod=None, scale=None,
                enable_gqa=False, out_transform=None, **kwargs):  # noqa: D102 - main's
        assert isinstance(attention_masks, tt_attention.BlockMask)
        one = [t.transpose(0, 1).unsqueeze(0) for t in (q_TNH, k_TNH, v_TNH)]
        out, _aux = tt_attention.FlexAttention.compiled_flex_attn(
            *one, score_mod=score_mod, block_mask=attention_masks, scale=scale,
            enable_gqa=enable_gqa, return_aux=tt_attention.AuxRequest(lse=False),
            kernel_options=self.kernel_options)
        return out.squeeze(0).transpose(0, 1)


class VarlenAttention(tt_attention.VarlenAttention):
    """Main's ``VarlenAttention`` call; SDPA under the per-document mask stands for CUDA's
    ``varlen_attn``."""

    @dataclass(kw_only=True, slots=True)
    class Config(tt_attention.VarlenAttention.Config):
        pass

    def forward(self, q_TNH, k_TNH, v_TNH, *, attention_masks, scale=None, out_transform=None,
                **kwargs):  # noqa: D102 - main's
        from titan_rocm.workarounds.mla_ck_backward.documents import dense_mask

        assert isinstance(attention_masks, VarlenMetadata)
        mask = dense_mask(attention_masks.cu_seq_q, 1, q_TNH.shape[0])
        return sdpa_tokens(q_TNH, k_TNH, v_TNH, mask, scale)


class Attention(tt_deepseek.Attention):
    """Main's DeepSeek V3 MLA over ``(T, D)`` tokens."""

    @dataclass(kw_only=True, slots=True)
    class Config(tt_deepseek.Attention.Config):
        pass

    def forward(self, x, attention_masks, positions=None):  # noqa: D102 - main's
        tokens = x.shape[0]
        q = self.wq(x) if self.q_lora_rank == 0 else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(tokens, -1, self.qk_head_dim)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        kv, k_pe = torch.split(self.wkv_a(x), [self.kv_lora_rank, self.qk_rope_head_dim],
                               dim=-1)
        q_pe, k_pe = self._rope(q_pe, k_pe.unsqueeze(1), positions)
        q = torch.cat([q_nope, q_pe], dim=-1)
        kv = self.wkv_b(self.kv_norm(kv)).view(tokens, -1,
                                               self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, k_nope.size(1), -1)], dim=-1)
        out = self.inner_attention(q, k, v, attention_masks=attention_masks,
                                   scale=self.softmax_scale).contiguous()
        return self.wo(out.view(tokens, -1))

    def _rope(self, q_pe, k_pe, positions):
        """Main's RoPE on ``[T]`` positions: 0.3.0's on a batch of one."""
        batch = None if positions is None else positions.unsqueeze(0)
        q_pe, k_pe = self.rope(q_pe.unsqueeze(0), k_pe.unsqueeze(0), batch)
        return q_pe.squeeze(0), k_pe.squeeze(0)


class DeepSeekV3Model(tt_deepseek.DeepSeekV3Model):
    """Main's decoder: ``[T]`` tokens and positions, masks over the folded tokens."""

    @dataclass(kw_only=True, slots=True)
    class Config(tt_deepseek.DeepSeekV3Model.Config):
        @property
        def max_context_length(self) -> int:
            """The first attention's RoPE length (0.3.0 names it ``max_seq_len``)."""
            return self.first_attention.rope.max_seq_len

    def get_attention_masks(self, positions):  # noqa: D102 - main's
        inner = self.config.first_attention.inner_attention
        if isinstance(inner, tt_attention.FlexAttention.Config):
            tokens = positions.shape[0]
            mask = and_masks(_causal, packed_document_mask_mod(positions))
            return create_block_mask(mask, 1, None, tokens, tokens, device=positions.device,
                                     BLOCK_SIZE=inner.block_size)
        if isinstance(inner, tt_attention.VarlenAttention.Config):
            return create_varlen_metadata_for_document(positions)
        raise TypeError(f"Only VarlenAttention and FlexAttention support attention masks, "
                        f"got {type(inner).__name__}")


def _as(cls: type, config: Any, **changes: Any) -> Any:
    """``config``'s fields in the stand-in config class ``cls``."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return cls(**{**fields, **changes})


def _main_sharding(sharding: Any) -> Any:
    if sharding is None:
        return None
    renamed = {name: {SHARDING_NAMES.get(k, k): v for k, v in (getattr(sharding, name) or {})
                      .items()} or None
               for name in ("in_src_shardings", "in_dst_shardings")}
    return dataclasses.replace(sharding, **renamed)


def main_shaped(config: Any) -> Any:
    """A 0.3.0 DeepSeek ``Trainer.Config`` with main's attention: its model config and every
    attention config (inner ``FlexAttention``/``VarlenAttention``) in the stand-in classes,
    sharding keys renamed as main names them; call after ``update_from_config``."""
    model = config.model_spec.model
    for layer in model.layers:
        attention, inner = layer.attention, layer.attention.inner_attention
        stand_in = {tt_attention.FlexAttention.Config: FlexAttention.Config,
                    tt_attention.VarlenAttention.Config: VarlenAttention.Config}.get(type(inner))
        if stand_in is not None:
            inner = _as(stand_in, inner, sharding_config=_main_sharding(inner.sharding_config))
        layer.attention = _as(Attention.Config, attention, inner_attention=inner)
    config.model_spec.model = _as(DeepSeekV3Model.Config, model)
    return config


def deepseek_v3_debugmodel() -> Any:
    """0.3.0's DeepSeek V3 debug model with main's attention, sharding configs set."""
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel as stock

    config = stock()
    config.model_spec.model.update_from_config(config=config)
    return main_shaped(config)


def deepseek_v3_debugmodel_rocm() -> Any:
    """:func:`deepseek_v3_debugmodel` through ``rocm(cfg)``: a ``--config`` for the plan."""
    from titan_rocm.adapters.tt030 import rocm

    return rocm(deepseek_v3_debugmodel())


def main_attention() -> SimpleNamespace:
    """The main-shaped classes a test runs on: TorchTitan main's own where the installed
    TorchTitan folds its tokens, else this stand-in."""
    if torchtitan_version.FOLDED_TOKENS in torchtitan_version.detect().variants:
        from torchtitan.models.common import attention as main
        from torchtitan.models.deepseek_v3 import config_registry

        def debugmodel() -> Any:
            config = config_registry.deepseek_v3_debugmodel()
            config.model_spec.model.update_from_config(config=config)
            return config

        return SimpleNamespace(
            real=True, FlexAttention=main.FlexAttention, VarlenAttention=main.VarlenAttention,
            VarlenMetadata=main.VarlenMetadata, debugmodel=debugmodel,
            create_varlen_metadata_for_document=main.create_varlen_metadata_for_document,
            sharding_names=tuple(SHARDING_NAMES.values()))
    return SimpleNamespace(
        real=False, FlexAttention=FlexAttention, VarlenAttention=VarlenAttention,
        VarlenMetadata=VarlenMetadata, debugmodel=deepseek_v3_debugmodel,
        create_varlen_metadata_for_document=create_varlen_metadata_for_document,
        sharding_names=tuple(SHARDING_NAMES.values()))
