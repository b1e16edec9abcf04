"""The ``rocm.gemm_lookup`` workaround: compile GEMMs with kernels ``titan-rocm tune`` validated
(docs/validated-tuning.md).

Stock max-autotune never checks a candidate is right (on ROCm a miscompiled config is often
the fastest), so each GEMM gets one candidate: the table's winner, or ATen on a miss. The
handler's ``uuid()`` is the table's sha256 so the FX-graph cache keys on the table."""

from __future__ import annotations

import atexit
import logging
from typing import Any

import torch.nn as nn

from titan_rocm.log import log, log_once
from titan_rocm.tuned_gemms import table as table_module
from titan_rocm.workarounds.base import Workaround


class GemmLookup(Workaround):
    """One validated kernel per GEMM from ``[rocm] gemm_lookup_table``; ATen on a miss."""

    name = "gemm_lookup"
    audit_shapes = "compiled"

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        text = "each GEMM compiles with the kernel titan-rocm tune validated"
        coverage = details.get("coverage")
        if not coverage:
            return text
        text += f" ({coverage['covered']}/{coverage['problems']} of the job's GEMMs in the table"
        if coverage.get("job_differs"):
            text += ("; the problems file is not this job's: "
                     + "; ".join(coverage["job_differs"]))
        return text + ")"
    needs_rocm = False  # a table names its device; auto applies wherever one is named

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.table: table_module.TableFile | None = None
        self.mismatches: list[str] = []
        self.stats: Any = None
        self.dry_run = False
        self._reported_first_step = False

    @property
    def path(self) -> str:
        """``[rocm] gemm_lookup_table``."""
        return self.ctx.settings.gemm_lookup_table

    def unmet(self) -> str | None:
        if not self.path:
            return "no table named ([rocm] gemm_lookup_table is empty)"
        try:
            self.table = table_module.read(self.path)
        except table_module.LookupTableError as exc:
            return str(exc)
        if self.ctx.planning:
            # plan runs on a login node: its torch and Triton are not the run's, so only the
            # device is compared, with the (simulated) GPU planned for, as the run would.
            return self._planned_device_mismatch()
        from titan_rocm.tuned_gemms.env import environment

        self.mismatches = table_module.meta_mismatches(self.table.meta, environment())
        if self.mismatches:
            reason = (f"table {self.path} was tuned for another device or software: "
                      + "; ".join(self.mismatches))
            if self.mode == "auto":
                log_once(f"gemm_lookup-meta:{self.path}", logging.WARNING,
                         "titan-rocm: gemm_lookup: %s; not used", reason)
            return reason
        return None

    def _planned_device_mismatch(self) -> str | None:
        assert self.table is not None
        arch = self.ctx.platform.gfx_arch if self.ctx.platform.is_rocm else None
        if arch is None:
            return None
        device, key = self.table.meta.get("device"), self.table.meta.get("device_key")
        if str(key or "").split(":")[0] == arch:
            return None
        self.mismatches = [f"device: table {device!r} (device_key {key!r}), planned {arch!r}"]
        reason = (f"table {self.path} was tuned for another device: {self.mismatches[0]}; the "
                  "run would not use it")
        if self.mode == "auto":
            log_once(f"gemm_lookup-meta:{self.path}", logging.WARNING,
                     "titan-rocm: gemm_lookup: %s", reason)
        return reason

    def check(self, model: nn.Module) -> str | None:
        if not self.ctx.compile.model:
            return "compile disabled ([compile] enable = false): Inductor lowers no GEMM"
        return None

    def apply(self, model: nn.Module) -> None:
        assert self.table is not None  # unmet() read it
        if self.ctx.planning:
            self.dry_run = True
            return
        from titan_rocm.tuned_gemms.choices import (
            ChoicesFactory,
            LookupStats,
            TableChoices,
            install,
        )

        table, stats = self.table, LookupStats()
        self.stats = stats
        install(ChoicesFactory(lambda: TableChoices(table.table, table.sha256, stats)))
        atexit.register(self.report, "the end of training")
        log.info("titan-rocm: gemm_lookup: %d keys from %s (sha256 %s, tuned on %s); "
                 "max-autotune-gemm with ATEN,TRITON, one validated kernel per GEMM, ATen on "
                 "a miss", len(table.table), self.path, table.sha256[:12],
                 table.meta.get("device"))

    def report(self, when: str) -> None:
        """Log the hits and misses so far."""
        if self.stats is None:
            return
        totals = self.stats.to_dict()
        log.info("titan-rocm: gemm_lookup at %s: %d GEMM lowerings from the table, %d misses "
                 "(ATen)%s", when, totals["hits"], totals["misses"],
                 f"; missed keys: {totals['missed_keys'][:5]}" if totals["misses"] else "")

    def audit_note(self) -> str | None:
        """Lowerings from the table: a table the job never hits proves nothing."""
        if self.stats is None:
            return None
        totals = self.stats.to_dict()
        return (f"gemm_lookup: {totals['hits']} GEMM lowerings from the table, "
                f"{totals['misses']} misses (ATen) in this process")

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        """After the first step (every GEMM has been lowered by then): hits and misses."""
        if not self._reported_first_step:
            self._reported_first_step = True
            self.report("the first step")

    def plan(self, model: nn.Module) -> dict[str, Any]:
        details: dict[str, Any] = {"table": self.path or None}
        if self.table is not None:
            details.update(sha256=self.table.sha256, keys=len(self.table.table),
                           meta={k: self.table.meta.get(k) for k in (
                               "device", *table_module.META_FIELDS, "created")})
        if self.mismatches:
            details["meta_mismatches"] = self.mismatches
        if self.dry_run:
            details["dry_run"] = "choices handler not installed"
        if self.stats is not None:
            details["lookups"] = self.stats.to_dict()
        return details
