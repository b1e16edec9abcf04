"""``rocm.mla_ck_backward``: DeepSeek MLA attention on aiter, CK backward where it must be.

Gate (``auto``): a ROCm build with a GPU and aiter installed, a model with TorchTitan's
DeepSeek V3 attention whose mask is plain causal (``attn_type = "sdpa"``, or ``"flex"`` with
``attn_mask_type = "causal"``), no context parallelism, and (on a real machine)
``aiter.ops.mha`` importing cleanly. Otherwise one line says why and the model is left
untouched; nothing imports aiter. ``on`` fails at start-up, naming what is missing. Flex
flavors with ``block_causal`` (per-document) masks are converted only with
``[rocm] mla_document_masks = "drop"``: they then run plain causal attention, as the aiter
path used in practice does (warned at apply).

Apply: each DeepSeek V3 ``Attention.inner_attention`` becomes
:class:`~.module.MLAInnerAttention` (or :class:`~.module.MLAFlexInnerAttention` for flex);
the forward op joins the op-level SAC save list of the
model's parallelize module (``_op_sac_save_list``) so it is saved, not recomputed; and
aiter's own ``_flash_attn_backward`` is guarded (:mod:`~.guard`).
"""

from __future__ import annotations

import importlib
from collections import Counter
from typing import Any

import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.base import TORCHTITAN_030, Context, Workaround
from titan_rocm.workarounds.mla_attention import aiter_api
from titan_rocm.workarounds.mla_attention.routing import (
    DTYPES,
    BackwardCall,
    arch_label,
    route_backward,
)

DEEPSEEK_PARALLELIZE = "torchtitan.models.deepseek_v3.infra.parallelize"
SAC_LIST_NAME = "_op_sac_save_list"
FORWARD_LABEL = "aiter flash attention (_flash_attn_forward)"
NOT_ON_030 = (
    "not wired for TorchTitan 0.3.0 yet: its language models always run per-document masks "
    "(Flex or Varlen inner_attention configs), and the aiter varlen path that serves them "
    "(docs/mla-ck-backward.md) is built for 0.2.2 first"
)
SDPA_LABEL = "PyTorch SDPA (fallback)"


def deepseek_attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(fqn, module)`` of every TorchTitan DeepSeek V3 MLA ``Attention`` in ``model``."""
    from torchtitan.models.deepseek_v3.model.model import Attention

    return [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, Attention)]


def replacement_for(attention: nn.Module) -> type[nn.Module] | None:
    """The module class that replaces ``attention.inner_attention``; None if none does
    (an unknown attention kind, or already replaced)."""
    from torchtitan.models.attention import FlexAttentionWrapper, ScaledDotProductAttentionWrapper

    from titan_rocm.workarounds.mla_attention.module import (
        MLAFlexInnerAttention,
        MLAInnerAttention,
    )

    inner = attention.inner_attention
    if isinstance(inner, MLAInnerAttention):
        return None
    if isinstance(inner, ScaledDotProductAttentionWrapper):
        return MLAInnerAttention
    if isinstance(inner, FlexAttentionWrapper):
        return MLAFlexInnerAttention
    return None


def _is_ours(attention: nn.Module) -> bool:
    from titan_rocm.workarounds.mla_attention.module import MLAInnerAttention

    return isinstance(attention.inner_attention, MLAInnerAttention)


def _is_flex(attention: nn.Module) -> bool:
    from torchtitan.models.attention import FlexAttentionWrapper

    from titan_rocm.workarounds.mla_attention.module import MLAFlexInnerAttention

    return isinstance(attention.inner_attention, (FlexAttentionWrapper, MLAFlexInnerAttention))


def mask_type(model: nn.Module) -> str:
    """The model's ``attn_mask_type`` (``causal`` or ``block_causal``); ``causal`` if unset."""
    return str(getattr(getattr(model, "model_args", None), "attn_mask_type", "causal"))


def expected_attention_dtype(ctx: Context) -> str:
    """The dtype DeepSeek's q/k/v will have in training, as TorchTitan 0.2.2 sets it up.

    ``training.dtype = "bfloat16"`` keeps everything bf16; otherwise mixed precision
    (``mixed_precision_param``) applies through FSDP, or through autocast when neither TP
    nor PP is on, and float32 remains under TP/PP without FSDP.
    """
    if ctx.training_dtype == "bfloat16":
        return "bfloat16"
    parallel = ctx.parallel
    if parallel.fsdp_enabled or not (parallel.tp_enabled or parallel.pp_enabled):
        return ctx.mixed_precision_param
    return "float32"


class MLACKBackward(Workaround):
    """Swap DeepSeek V3 inner attention for aiter flash attention with a routed backward."""

    name = "mla_ck_backward"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._swapped: int | None = None
        self._sac_list: str | None = None
        self._guard: str | None = None

    # -- gate ----------------------------------------------------------------------------

    def unmet(self) -> str | None:
        missing = aiter_api.missing_requirements(self.ctx.platform)
        if missing:
            return "aiter not usable: missing " + "; ".join(missing)
        if self.ctx.parallel.cp_enabled:
            return (
                "context parallelism is on (context_parallel_degree > 1): CP shards SDPA ops, "
                "not the aiter op"
            )
        reason = aiter_api.unavailable_reason(self.ctx.platform, try_import=True)
        if reason:
            return f"aiter not usable: {reason}"
        return None

    def check(self, model: nn.Module) -> str | None:
        if self.ctx.framework == TORCHTITAN_030:
            return NOT_ON_030
        modules = deepseek_attention_modules(model)
        if not modules:
            return "model has no DeepSeek V3 MLA attention (torchtitan deepseek_v3 Attention)"
        if not any(replacement_for(m) or _is_ours(m) for _, m in modules):
            kinds = sorted({type(m.inner_attention).__name__ for _, m in modules})
            return (
                f"attention runs {', '.join(kinds)}; rocm.mla_ck_backward replaces only "
                "TorchTitan's SDPA and flex attention wrappers"
            )
        mask = mask_type(model)
        drops_masks = self.ctx.settings.mla_document_masks == "drop"
        if any(_is_flex(m) for _, m in modules) and mask != "causal" and not drops_masks:
            return (
                f"attention is FlexAttention with {mask!r} (per-document) masks; aiter's kernel is "
                "plain causal and would attend across documents; set [rocm] "
                'mla_document_masks = "drop" to run it causal anyway'
            )
        return None

    # -- apply ---------------------------------------------------------------------------

    def apply(self, model: nn.Module) -> None:
        swapped = flex = 0
        for _fqn, attention in deepseek_attention_modules(model):
            cls = replacement_for(attention)
            if cls is None:
                continue
            inner = attention.inner_attention
            attention.inner_attention = cls(getattr(inner, "sdpa_backends", None))
            swapped += 1
            flex += _is_flex(attention)
        self._swapped = swapped
        if flex and mask_type(model) != "causal":
            log.warning(
                "titan-rocm: mla_ck_backward (mla_document_masks = drop): %d flex attention "
                "modules with %r masks now "
                "run plain causal attention: tokens attend across document boundaries",
                flex,
                mask_type(model),
            )
        self._sac_list = self._save_forward_in_op_sac()
        if self.ctx.planning:
            self._guard = "not installed (plan)"
        else:
            from titan_rocm.workarounds.mla_attention import guard

            self._guard = guard.install()
        dtype = self._dtype()
        log.info(
            "titan-rocm: mla_ck_backward replaced %d DeepSeek inner_attention modules; "
            "op SAC save list: %s; aiter backward guard: %s",
            swapped,
            self._sac_list or "none found",
            self._guard,
        )
        if dtype not in DTYPES:
            log.warning(
                "titan-rocm: mla_ck_backward: attention will run in %s, which aiter does not "
                "take; it falls back to PyTorch SDPA (train in bfloat16 or use FSDP mixed "
                "precision)",
                dtype,
            )

    def _save_forward_in_op_sac(self) -> str | None:
        """Add the forward op to ``_op_sac_save_list`` of the parallelize module(s) found."""
        from titan_rocm.workarounds.mla_attention.op import FORWARD_OP

        found: list[str] = []
        for module_name in self._parallelize_modules():
            try:
                module = importlib.import_module(module_name)
            except Exception:  # an optional model module that cannot load
                continue
            save_list = getattr(module, SAC_LIST_NAME, None)
            if isinstance(save_list, set):
                save_list.add(FORWARD_OP)
                found.append(f"{module_name}.{SAC_LIST_NAME}")
        return ", ".join(found) or None

    def _parallelize_modules(self) -> list[str]:
        names: list[str] = []
        if self.ctx.parallelize_fn is not None:
            names.append(self.ctx.parallelize_fn.__module__)
        if DEEPSEEK_PARALLELIZE not in names:
            names.append(DEEPSEEK_PARALLELIZE)
        return names

    # -- plan ----------------------------------------------------------------------------

    def _dtype(self) -> str:
        return expected_attention_dtype(self.ctx)

    def plan(self, model: nn.Module) -> dict[str, Any]:
        """Per model shape: the arch, the forward, and the backward route (no aiter import).

        E.g. ``{"arch": "gfx942", "shape": {"qk": 192, "v": 128}, "backward": "ck (mha_bwd)",
        "modules": 26, ...}``; more shapes (not seen in DeepSeek) go under ``other_shapes``.
        """
        if self.ctx.framework == TORCHTITAN_030:
            return {}  # its skip reason says it all
        facts = self.ctx.platform
        modules = deepseek_attention_modules(model)
        shapes = Counter(
            (int(m.qk_nope_head_dim + m.qk_rope_head_dim), int(m.v_head_dim)) for _, m in modules
        )
        dtype = self._dtype()
        rows = [self._plan_row(facts.gfx_arch, qk, v, dtype, n) for (qk, v), n in shapes.items()]
        flex = any(_is_flex(m) for _, m in modules)
        details: dict[str, Any] = rows[0] if rows else {"arch": arch_label(facts.gfx_arch),
                                                        "modules": 0}
        if len(rows) > 1:
            details["other_shapes"] = rows[1:]
        details["dtype"] = dtype
        if modules:
            details["attention"] = f"flex ({mask_type(model)} mask)" if flex else "sdpa (causal)"
        if self._swapped is not None:
            details["replaced"] = self._swapped
            details["op_sac_save_list"] = self._sac_list
            details["guard"] = self._guard
        return details

    def _plan_row(self, arch: str | None, qk: int, v: int, dtype: str, n: int) -> dict[str, Any]:
        row: dict[str, Any] = {"arch": arch_label(arch), "shape": {"qk": qk, "v": v}}
        if dtype not in DTYPES:
            row.update(forward=SDPA_LABEL, backward=SDPA_LABEL,
                       reason=f"{dtype} is not an aiter dtype ({', '.join(DTYPES)})")
        else:
            route = route_backward(
                BackwardCall(arch, qk, qk, v, dtype=dtype, deterministic=self.ctx.deterministic)
            )
            row.update(forward=FORWARD_LABEL, backward=route.label, reason=route.reason)
        row["modules"] = n
        return row
