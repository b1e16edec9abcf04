"""The ``rocm.triton_war`` workaround (docs/triton-buffer-store-hazard.md); a running compile-worker
pool is restarted so its workers get the exported environment."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import tempfile
import time
from typing import Any

import torch.nn as nn

from titan_rocm.log import log, log_once
from titan_rocm.scanner.names import ENV_ENABLE, ENV_STATS_DIR
from titan_rocm.workarounds.base import Context, Workaround
from titan_rocm.workarounds.triton_war import bootstrap, cache_tag, stats

WORKER_REACH = (
    "sitecustomize: titan-rocm's _boot directory first on sys.path/PYTHONPATH, gated by "
    f"{ENV_ENABLE}=1; installs the wrapper when a child imports triton"
)
STATS_EVERY_S = 60.0


def restart_compile_workers() -> bool:
    """Shut down running compile-worker pools so they restart with this environment; True if one
    ran."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is None or not getattr(async_compile, "_pool_set", None):
        return False
    async_compile.shutdown_compile_workers()
    return True


def _triton_missing() -> bool:
    return importlib.util.find_spec("triton") is None


class TritonWar(Workaround):
    """Scan every HIP kernel's AMDGCN; recompile hazardous ones with buffer ops off."""

    name = "triton_war"
    codegen = True
    audit_shapes = "compiled"
    not_measured = ("not measured on a GPU: it acts on HIP kernels only, and no AMD GPU was "
                    "available")

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        return ("every HIP kernel's AMDGCN scanned for the buffer-store hazard "
                f"(rule {details.get('rule', '?')}); hazardous ones recompile without "
                "buffer ops")

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.exported: dict[str, str] = {}
        self.tag: str | None = None
        self.tag_error: str | None = None
        self.workers_restarted = False
        self.dry_run = False
        self._next_stats = 0.0
        self._reported_residual: set[str] = set()

    @property
    def rule(self) -> str:
        """``[rocm] triton_war_rule`` where titan-rocm knows the arch's hazard windows, else
        ``conservative``: no facts to narrow the window."""
        return self.ctx.settings.triton_war_rule if self._windows_known() else "conservative"

    def _windows_known(self) -> bool:
        arch = self.ctx.platform.arch
        return arch is not None and arch.store_hazard_windows

    def _rule_note(self) -> str | None:
        if self._windows_known() or self.ctx.settings.triton_war_rule == "conservative":
            return None
        gfx = self.ctx.platform.gfx_arch or "unknown (no device)"
        return (f"titan-rocm has no hazard-window facts for GPU architecture {gfx}: scanning with "
                f"the conservative rule instead of [rocm] triton_war_rule = "
                f"{self.ctx.settings.triton_war_rule!r}")

    @property
    def strict(self) -> bool:
        """``[rocm] triton_war_strict``."""
        return bool(self.ctx.settings.triton_war_strict)

    def unmet(self) -> str | None:
        if _triton_missing():
            return (
                'Triton is not installed ("import triton" finds no module; install '
                "pytorch-triton-rocm on ROCm, or triton): no Triton kernels to scan"
            )
        return None

    # No check(): under auto the WAR applies on every ROCm GPU (the base gate's ROCm test),
    # as AMD-AGI/Primus's _on_rocm() does; per-arch facts only choose the rule's windows.

    def apply(self, model: nn.Module) -> None:
        note = self._rule_note()
        if note is not None:
            log_once("triton_war.rule", logging.WARNING, "titan-rocm: %s", note)
        if self.ctx.planning:
            self.dry_run = True  # plan: no wrapper, no environment, no stats directory
            return
        from titan_rocm.workarounds.triton_war import compile_hook

        compile_hook.install(rule=self.rule, strict=self.strict)
        stats_dir = os.environ.get(ENV_STATS_DIR)
        if stats_dir:
            os.makedirs(stats_dir, exist_ok=True)
        else:
            stats_dir = tempfile.mkdtemp(prefix="titan-rocm-triton-war-")
        self.exported = bootstrap.export(self.rule, self.strict, stats_dir)
        try:
            self.tag = cache_tag.apply(self.rule)
        except RuntimeError as e:
            self.tag_error = str(e)
            log.error("titan-rocm: %s", e)
        self.workers_restarted = restart_compile_workers()
        log.info(
            "titan-rocm: triton_war wrapper installed (rule %s, strict %s); compile workers "
            "install it via sitecustomize; stats in %s%s", self.rule, self.strict, stats_dir,
            "; restarted the running compile-worker pool" if self.workers_restarted else "",
        )

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        """At most every :data:`STATS_EVERY_S`, log each newly seen residual kernel of a worker."""
        now = time.monotonic()
        if now < self._next_stats or self.dry_run:
            return
        first = self._next_stats == 0.0
        self._next_stats = now + STATS_EVERY_S
        try:
            merged = stats.collect()
        except OSError as e:
            log.error("titan-rocm: cannot read triton_war stats: %s", e)
            return
        new = [k for k in merged.names.get(stats.RESIDUAL, []) if k not in self._reported_residual]
        if new:
            self._reported_residual.update(new)
            log.error(
                "titan-rocm: Triton kernel(s) keep the buffer-store data hazard (outputs may be "
                "corrupt): %s; see the compile-worker logs for details", ", ".join(new),
            )
        if first:
            log.info(
                "titan-rocm: triton_war after the first step: %d compiles in %d process(es), "
                "%d scanned, %d patched, %d residual", merged.compiled, merged.processes,
                merged.scanned, merged.patched, merged.residual,
            )

    def plan(self, model: nn.Module) -> dict[str, Any]:
        details: dict[str, Any] = {
            "rule": self.rule,
            **({"rule_note": note} if (note := self._rule_note()) else {}),
            "strict": self.strict,
            "worker_reach": WORKER_REACH,
        }
        if _triton_missing():
            return details
        from titan_rocm.workarounds.triton_war import buffer_ops, compile_hook

        try:
            details["buffer_ops_knob"] = buffer_ops.buffer_ops_knob().to_dict()
        except Exception as e:  # plan must still print; say what failed
            details["buffer_ops_knob"] = f"cannot inspect Triton: {e!r}"
        if self.dry_run:
            details["dry_run"] = "wrapper, worker environment and cache tag not applied"
            return details
        if compile_hook.installed() is not None:
            details["wrapper_bound"] = compile_hook.bound_sites()
        details["environment"] = self.exported
        details["cache_key_tag"] = self.tag if self.tag else self.tag_error
        details["compile_workers_restarted"] = self.workers_restarted
        if self.exported:
            try:
                details["stats"] = stats.collect().to_dict()
            except OSError as e:
                details["stats"] = f"cannot read: {e}"
        return details
