"""``rocm.mla_ck_backward``: DeepSeek MLA attention on aiter, each direction routed by the
device's real arch and the installed aiter release.

Gate (``auto``): a ROCm build with a GPU and aiter installed, ``aiter.ops.mha`` importing
cleanly (on a real machine), no context parallelism (CP shards SDPA ops, not aiter's; TorchTitan
0.2.2 refuses flex attention with CP anyway), and a model with TorchTitan's DeepSeek V3
attention. Otherwise one line says why and the model is left untouched; nothing imports
aiter. ``on`` fails at start-up, naming what is missing.

What each DeepSeek ``Attention.inner_attention`` becomes:

- SDPA (``attn_type = "sdpa"``): :class:`~.module.MLAInnerAttention`, aiter dense attention;
- flex with ``causal`` masks: :class:`~.module.MLAFlexInnerAttention`, the same;
- flex with ``block_causal`` (per-document) masks, TorchTitan 0.2.2's 16B/236B/671B flavors:
  :class:`~.module.MLAVarlenInnerAttention`, aiter's varlen attention within each document, and
  the model's ``get_attention_masks`` returns :class:`~.documents.DocumentSpans` (the document
  boundaries TorchTitan computes). Not under pipeline parallelism, which re-splits the masks
  per microbatch. With ``[rocm] mla_document_masks = "drop"`` these run plain causal
  attention instead (tokens attend across documents; warned at apply).

Also: the forward ops join the op-level SAC save list of the model's parallelize module
(``_op_sac_save_list``), so they are saved, not recomputed; aiter's own ``_flash_attn_backward``
is guarded (:mod:`~.guard`); and a ``get_gfx()`` that names another arch than the device is
logged once.

TorchTitan 0.3.0 (``ctx.framework``): the same gate, kinds, routes and plan through
:mod:`~.tt030`, whose replacements are inner-attention configs of titan-rocm's own (the
varlen one a ``VarlenAttention.Config``, so TorchTitan's own ``get_attention_masks`` returns
the document boundaries) running the same varlen and dense paths.
"""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from types import ModuleType
from typing import Any

import torch.nn as nn

from titan_rocm import platform
from titan_rocm.log import log, log_once
from titan_rocm.platform import PlatformFacts
from titan_rocm.workarounds.base import TORCHTITAN_030, Context, Workaround
from titan_rocm.workarounds.mla_attention import aiter_api
from titan_rocm.workarounds.mla_attention.aiter_releases import release_for
from titan_rocm.workarounds.mla_attention.kinds import (
    ATTENTION_LABELS,
    DENSE,
    DROPPED,
    FLEX_CAUSAL,
    VARLEN,
)
from titan_rocm.workarounds.mla_attention.routing import (
    DTYPES,
    AttentionCall,
    arch_label,
    route_backward,
    route_forward,
)

DEEPSEEK_PARALLELIZE = "torchtitan.models.deepseek_v3.infra.parallelize"
SAC_LIST_NAME = "_op_sac_save_list"
SDPA_LABEL = "PyTorch SDPA (fallback)"
DOCUMENT_MASKS_022 = (
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

    from titan_rocm.workarounds.mla_attention.module import (
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
    from titan_rocm.workarounds.mla_attention.module import (
        MLAFlexInnerAttention,
        MLAInnerAttention,
        MLAVarlenInnerAttention,
    )

    return {DENSE: MLAInnerAttention, FLEX_CAUSAL: MLAFlexInnerAttention,
            VARLEN: MLAVarlenInnerAttention, DROPPED: MLAFlexInnerAttention}[kind]


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


def aiter_summary(facts: PlatformFacts) -> dict[str, Any] | str:
    """The installed aiter as plans show it (``absent`` without one)."""
    aiter = facts.aiter
    if aiter is None:
        return "absent" if not facts.aiter_spec_found else "installed (not probed)"
    release = release_for(aiter.version)
    return {
        "version": aiter.version or "unknown",
        "api": aiter.generation or "unknown",
        "release_facts": release.name if release else "unknown",
        "get_gfx": aiter.gfx,
        "get_gfx_source": aiter.gfx_source,
        "get_gfx_matches_device": not aiter.mismatch(facts.gfx_arch),
    }


class MLACKBackward(Workaround):
    """Swap DeepSeek V3 inner attention for aiter flash attention, routed per call."""

    name = "mla_ck_backward"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._replaced: dict[str, int] | None = None
        self._sac_list: str | None = None
        self._guard: str | None = None
        self._facts: PlatformFacts | None = None

    @property
    def _drop_documents(self) -> bool:
        return self.ctx.settings.mla_document_masks == "drop"

    @property
    def _tt030(self) -> ModuleType | None:
        """TorchTitan 0.3.0's seam (:mod:`.tt030`) in a 0.3.0 job, else None (imported only
        there: it subclasses 0.3.0's classes)."""
        if self.ctx.framework != TORCHTITAN_030:
            return None
        from titan_rocm.workarounds.mla_attention import tt030

        return tt030

    def _attentions(self, model: nn.Module) -> dict[str, nn.Module]:
        seam = self._tt030
        return dict(seam.attention_modules(model) if seam else deepseek_attention_modules(model))

    # -- gate ----------------------------------------------------------------------------

    def unmet(self) -> str | None:
        missing = aiter_api.missing_requirements(self.ctx.platform)
        if missing:
            return "aiter not usable: missing " + "; ".join(missing)
        if self.ctx.parallel.cp_enabled:
            return (
                "context parallelism is on (context_parallel_degree > 1): CP shards SDPA ops, "
                "not the aiter ops"
            )
        reason = aiter_api.unavailable_reason(self.ctx.platform, try_import=True)
        if reason:
            return f"aiter not usable: {reason}"
        return None

    def _kinds(self, model: nn.Module) -> dict[str, str | None]:
        seam = self._tt030
        if seam:
            return {fqn: seam.attention_kind(m, self._drop_documents)
                    for fqn, m in seam.attention_modules(model)}
        masks = mask_type(model)
        return {fqn: attention_kind(m, masks, self._drop_documents)
                for fqn, m in deepseek_attention_modules(model)}

    def check(self, model: nn.Module) -> str | None:
        kinds = self._kinds(model)
        if not kinds:
            return "model has no DeepSeek V3 MLA attention (torchtitan deepseek_v3 Attention)"
        if not any(kinds.values()):
            attentions = self._attentions(model)
            names = sorted({type(attentions[f].inner_attention).__name__ for f in kinds})
            stock = ("TorchTitan's ScaledDotProductAttention, FlexAttention and causal "
                     "VarlenAttention" if self._tt030 else
                     "TorchTitan's SDPA and flex attention wrappers")
            return f"attention runs {', '.join(names)}; rocm.mla_ck_backward replaces only {stock}"
        seam = self._tt030
        if seam:
            if VARLEN in kinds.values() and self.ctx.parallel.pp_enabled:
                return seam.PP_REASON
            return seam.check(model, kinds)
        if VARLEN in kinds.values():
            if self.ctx.parallel.pp_enabled:
                return (
                    "block_causal (per-document) masks under pipeline parallelism: PP splits "
                    "the masks per microbatch into plain BlockMasks, without titan-rocm's "
                    'document spans; turn PP off, or set [rocm] mla_document_masks = "drop" '
                    "(causal attention across documents)"
                )
            if not callable(getattr(model, "get_attention_masks", None)):
                return "block_causal masks, but the model has no get_attention_masks to replace"
        return None

    # -- apply ---------------------------------------------------------------------------

    def apply(self, model: nn.Module) -> None:
        seam = self._tt030
        if seam:
            replaced = Counter(seam.replace(model, self._kinds(model)))
            self._sac_list = seam.save_forward_in_op_sac()
        else:
            replaced = self._replace_022(model)
            self._sac_list = self._save_forward_in_op_sac()
        self._replaced = dict(replaced)
        if replaced[DROPPED]:
            log.warning(
                "titan-rocm: mla_ck_backward (mla_document_masks = drop): %d flex attention "
                "modules with %r masks now run plain causal attention: tokens attend across "
                "document boundaries",
                replaced[DROPPED],
                "block_causal" if seam else mask_type(model),
            )
        if self.ctx.planning:
            self._guard = "not installed (plan)"
        else:
            from titan_rocm.workarounds.mla_attention import guard

            self._guard = guard.install()
        self._facts = platform.reprobe_aiter() if not self.ctx.planning else None
        self._say_gfx_mismatch(self._facts or self.ctx.platform)
        log.info(
            "titan-rocm: mla_ck_backward replaced %s DeepSeek inner_attention modules; "
            "op SAC save list: %s; aiter backward guard: %s",
            ", ".join(f"{n} {kind}" for kind, n in replaced.items()) or "no",
            self._sac_list or "none found",
            self._guard,
        )
        dtype = self._attention_dtype()
        if dtype not in DTYPES:
            log.warning(
                "titan-rocm: mla_ck_backward: attention will run in %s, which aiter does not "
                "take; it falls back to PyTorch (train in bfloat16 or use FSDP mixed precision)",
                dtype,
            )

    def _replace_022(self, model: nn.Module) -> Counter[str]:
        """TorchTitan 0.2.2: swap the wrappers; per-document masks become DocumentSpans."""
        from titan_rocm.workarounds.mla_attention import documents

        replaced: Counter[str] = Counter()
        attentions = dict(deepseek_attention_modules(model))
        kinds = self._kinds(model)
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

    def _attention_dtype(self) -> str:
        seam = self._tt030
        if seam:
            return seam.attention_dtype(self.ctx.training_dtype, self.ctx.mixed_precision_param)
        return expected_attention_dtype(self.ctx)

    def _say_gfx_mismatch(self, facts: PlatformFacts) -> None:
        aiter = facts.aiter
        if aiter is None or not aiter.mismatch(facts.gfx_arch):
            return
        log_once(
            "mla_gfx_mismatch",
            logging.WARNING,
            "titan-rocm: mla_ck_backward: aiter's get_gfx() answers %s (%s) but the device is "
            "%s; aiter's Python dispatch plans for %s while its kernels run on %s. titan-rocm "
            "routes MLA attention, forward and backward, by the device's arch (routes in "
            "titan-rocm plan and in the route log lines); set GPU_ARCHS=%s to make aiter agree",
            aiter.gfx,
            aiter.gfx_source,
            facts.gfx_arch,
            aiter.gfx,
            facts.gfx_arch,
            facts.gfx_arch,
        )

    def _save_forward_in_op_sac(self) -> str | None:
        """Add the forward ops to ``_op_sac_save_list`` of the parallelize module(s) found."""
        from titan_rocm.workarounds.mla_attention.op import FORWARD_OPS

        found: list[str] = []
        for module_name in self._parallelize_modules():
            try:
                module = importlib.import_module(module_name)
            except Exception:  # an optional model module that cannot load
                continue
            save_list = getattr(module, SAC_LIST_NAME, None)
            if isinstance(save_list, set):
                save_list.update(FORWARD_OPS)
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

    def skipped_plan(self, model: nn.Module) -> dict[str, Any]:
        if self.ctx.framework == TORCHTITAN_030 or not deepseek_attention_modules(model):
            return {}
        facts = self._facts or self.ctx.platform  # what the machine has, no routes
        return {"arch": arch_label(facts.gfx_arch), "aiter": aiter_summary(facts)}

    def plan(self, model: nn.Module) -> dict[str, Any]:
        """Per attention kind and shape: the routes a run gets (no aiter import).

        E.g. ``{"arch": "gfx942", "aiter": {...}, "attention": "varlen (...)", "shape":
        {"qk": 192, "v": 128}, "forward": "aiter (_flash_attn_varlen_forward)",
        "forward_runs": "CK mha_varlen_fwd", "backward": "ck (mha_varlen_bwd)", ...,
        "modules": 27}``; further kinds or shapes go under ``other_attention``.
        """
        from titan_rocm.workarounds.mla_attention.guard import NOT_COVERED

        facts = self._facts or self.ctx.platform
        kinds = self._kinds(model)
        attentions = self._attentions(model)
        groups = Counter(
            (kind, int(m.qk_nope_head_dim + m.qk_rope_head_dim), int(m.v_head_dim))
            for fqn, kind in kinds.items() if kind
            for m in (attentions[fqn],)
        )
        dtype = self._attention_dtype()
        rows = [self._plan_row(facts, kind, qk, v, dtype, n)
                for (kind, qk, v), n in groups.items()]
        if not facts.aiter_spec_found:  # no release to reason about: no routes to show
            for row in rows:
                for key in [k for k in row if k.startswith(("forward", "backward"))]:
                    del row[key]
        details: dict[str, Any] = {"arch": arch_label(facts.gfx_arch),
                                   "aiter": aiter_summary(facts)}
        details.update(rows[0] if rows else {"modules": 0})
        if len(rows) > 1:
            details["other_attention"] = rows[1:]
        details["dtype"] = dtype
        if VARLEN in kinds.values():
            seam = self._tt030
            details["document_masks"] = seam.DOCUMENT_MASKS if seam else DOCUMENT_MASKS_022
        if self._replaced is not None:
            details["replaced"] = self._replaced
            details["op_sac_save_list"] = self._sac_list
            details["guard"] = self._guard
        details["guard_not_covered"] = NOT_COVERED
        return details

    def _plan_row(self, facts: PlatformFacts, kind: str, qk: int, v: int, dtype: str,
                  n: int) -> dict[str, Any]:
        row: dict[str, Any] = {"attention": ATTENTION_LABELS[kind], "shape": {"qk": qk, "v": v}}
        if dtype not in DTYPES:
            why = f"{dtype} is not an aiter dtype ({', '.join(DTYPES)})"
            row.update(forward=SDPA_LABEL, backward=SDPA_LABEL, forward_reason=why,
                       backward_reason=why)
        else:
            aiter = facts.aiter
            call = AttentionCall(
                facts.gfx_arch, qk, qk, v, layout="thd" if kind == VARLEN else "bshd",
                dtype=dtype, deterministic=self.ctx.deterministic,
                aiter_gfx=aiter.gfx if aiter else None,
                aiter_version=aiter.version if aiter else None,
            )
            forward, backward = route_forward(call), route_backward(call)
            row.update(
                forward=forward.label, forward_runs=forward.kernel,
                forward_reason=forward.reason,
                backward=backward.label, backward_runs=backward.kernel,
                backward_reason=backward.reason,
            )
        row["modules"] = n
        return row
