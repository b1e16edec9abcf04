"""``rocm.mla_ck_backward``: DeepSeek MLA attention on aiter (docs/mla-ck-backward.md).

No context parallelism: CP shards SDPA ops, not aiter's. Per-document masks are not kept under
pipeline parallelism, which re-splits the masks per microbatch."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Protocol

import torch.nn as nn

from titan_rocm import platform
from titan_rocm.log import log, log_once
from titan_rocm.platform import PlatformFacts
from titan_rocm.workarounds.base import Context, Parallelism, Workaround
from titan_rocm.workarounds.mla_ck_backward import aiter_api
from titan_rocm.workarounds.mla_ck_backward.aiter_releases import installed_markers, release_for
from titan_rocm.workarounds.mla_ck_backward.kinds import (
    ATTENTION_LABELS,
    DROPPED_KINDS,
    VARLEN,
    VARLEN_KINDS,
)
from titan_rocm.workarounds.mla_ck_backward.routing import (
    DTYPES,
    AttentionCall,
    arch_label,
    route_backward,
    route_forward,
)

SDPA_LABEL = "PyTorch SDPA (fallback)"


class MLASeam(Protocol):
    """Where one generation's DeepSeek attention is read and replaced."""

    stock: str
    """The inner attentions titan-rocm replaces there, for the skip reason."""
    document_masks: str
    """Where the document boundaries of varlen attention come from, for the plan."""

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """``(fqn, module)`` of every DeepSeek V3 MLA ``Attention``."""

    def kinds(self, model: nn.Module, drop_documents: bool) -> dict[str, str | None]:
        """Each attention's kind (:mod:`.kinds`), None for one not replaced."""

    def check(self, model: nn.Module, kinds: dict[str, str | None],
              parallel: Parallelism) -> str | None:
        """Why the model's masks cannot follow the replaced attention (None: they can)."""

    def replace(self, model: nn.Module, kinds: dict[str, str | None]) -> Counter[str]:
        """Swap each inner attention for its kind's replacement; count them by kind."""

    def masks(self, model: nn.Module) -> str:
        """The mask type, for the warning of dropped document masks."""

    def save_forward_in_op_sac(self) -> str | None:
        """Make op-level SAC save the forward ops; say what was changed."""

    def attention_dtype(self) -> str:
        """The dtype q/k/v will have in training."""

    def machine_facts_when_skipped(self, model: nn.Module) -> bool:
        """A skipped plan shows the arch and aiter (a DeepSeek model that did not fit)."""

def aiter_summary(facts: PlatformFacts) -> dict[str, Any] | str:
    """The installed aiter as plans show it (``absent`` without one)."""
    aiter = facts.aiter
    if aiter is None:
        return "absent" if not facts.aiter_spec_found else "installed (not probed)"
    markers = installed_markers(facts)
    release = release_for(aiter.version, markers)
    return {
        "version": aiter.version or "unknown",
        "api": aiter.generation or "unknown",
        "markers": sorted(markers) or "none",
        "release_facts": release.name if release else "unknown",
        "get_gfx": aiter.gfx,
        "get_gfx_source": aiter.gfx_source,
        "get_gfx_matches_device": not aiter.mismatch(facts.gfx_arch),
    }


class MLACKBackward(Workaround):
    """Swap DeepSeek V3 inner attention for aiter flash attention, routed per call."""

    name = "mla_ck_backward"
    has_seam = True
    audit_shapes = "every"
    not_measured = "not measured: aiter runs on ROCm only"

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        return (f"MLA attention on aiter: forward {details.get('forward_runs', '?')}, "
                f"backward {details.get('backward_runs', '?')}")
    seam: MLASeam

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._replaced: dict[str, int] | None = None
        self._sac_list: str | None = None
        self._guard: str | None = None
        self._facts: PlatformFacts | None = None

    @property
    def _drop_documents(self) -> bool:
        return self.ctx.settings.mla_document_masks == "drop"

    def _attentions(self, model: nn.Module) -> dict[str, nn.Module]:
        return dict(self.seam.attention_modules(model))

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
        return self.seam.kinds(model, self._drop_documents)

    def check(self, model: nn.Module) -> str | None:
        kinds = self._kinds(model)
        if not kinds:
            return "model has no DeepSeek V3 MLA attention (torchtitan deepseek_v3 Attention)"
        if not any(kinds.values()):
            attentions = self._attentions(model)
            names = sorted({type(attentions[f].inner_attention).__name__ for f in kinds})
            return (f"attention runs {', '.join(names)}; rocm.mla_ck_backward replaces only "
                    f"{self.seam.stock}")
        return self.seam.check(model, kinds, self.ctx.parallel)

    # -- apply ---------------------------------------------------------------------------

    def apply(self, model: nn.Module) -> None:
        replaced = self.seam.replace(model, self._kinds(model))
        self._sac_list = self.seam.save_forward_in_op_sac()
        self._replaced = dict(replaced)
        dropped = sum(replaced[kind] for kind in DROPPED_KINDS)
        if dropped:
            log.warning(
                "titan-rocm: mla_ck_backward (mla_document_masks = drop): %d flex attention "
                "modules with %r masks now run plain causal attention: tokens attend across "
                "document boundaries",
                dropped,
                self.seam.masks(model),
            )
        if self.ctx.planning:
            self._guard = "not installed (plan)"
        else:
            from titan_rocm.workarounds.mla_ck_backward import guard

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

    def _attention_dtype(self) -> str:
        return self.seam.attention_dtype()

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

    # -- plan ----------------------------------------------------------------------------

    def skipped_plan(self, model: nn.Module) -> dict[str, Any]:
        if self.seam_problem() or not self.seam.machine_facts_when_skipped(model):
            return {}
        facts = self._facts or self.ctx.platform  # what the machine has, no routes
        return {"arch": arch_label(facts.gfx_arch), "aiter": aiter_summary(facts)}

    def plan(self, model: nn.Module) -> dict[str, Any]:
        """Per attention kind and shape: the routes a run gets (no aiter import)."""
        from titan_rocm.workarounds.mla_ck_backward.guard import NOT_COVERED

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
            details["document_masks"] = self.seam.document_masks
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
                facts.gfx_arch, qk, qk, v, layout="thd" if kind in VARLEN_KINDS else "bshd",
                dtype=dtype, deterministic=self.ctx.deterministic,
                aiter_gfx=aiter.gfx if aiter else None,
                aiter_version=aiter.version if aiter else None,
                aiter_markers=installed_markers(facts),
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
