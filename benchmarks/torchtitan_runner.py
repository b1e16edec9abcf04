"""Run TorchTitan's own trainer (``torchtitan.train`` as ``__main__``) and report what happened.

Every :class:`benchmarks.harness.Run` runs it under torchrun
(``python -m benchmarks.torchtitan_runner``). It changes nothing in training: it only
observes, and at exit prints one line ``TITAN_ROCM_RUN_REPORT {json}`` with
- host syncs counted by ``torch.cuda.set_sync_debug_mode("warn")`` (env ``COUNT_SYNCS=1``),
- Dynamo's counters (frames compiled, graph breaks),
- titan-rocm's counters: eager MoE block forwards, grouped-MM backend calls,
- Inductor's ``emulate_precision_casts`` value in force, and peak GPU memory;
- with ``TITAN_ROCM_RECORD_GRAPHS=1`` and ``--compile.backend titan_rocm_record_inductor``:
  every graph Dynamo compiled, audited
  (:func:`titan_rocm.testing.graph_audit.audit`: collectives, FSDP ops,
  MoE routing / permutation / grouped GEMM), then compiled by Inductor as usual.

TorchTitan 0.3.0 runs (``benchmarks/tt030_validation.py``) pass ``--module``/``--config``
instead of ``--job.config_file``, and may ask for the one shim :func:`apply_shims` offers.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import warnings

_syncs = {"count": 0}
RECORD_ENV = "TITAN_ROCM_RECORD_GRAPHS"
RECORD_BACKEND = "titan_rocm_record_inductor"
"""Pass ``--compile.backend titan_rocm_record_inductor`` with ``TITAN_ROCM_RECORD_GRAPHS=1``."""
_graphs: list[dict[str, object]] = []


def _register_recording_backend(inner: str = "inductor") -> None:
    """A Dynamo backend that audits each graph, then hands it to ``inner`` unchanged."""
    import torch
    from torch._dynamo.backends.registry import lookup_backend

    from titan_rocm.testing.graph_audit import audit

    compiler = lookup_backend(inner)

    def record_inductor(gm, example_inputs):  # noqa: ANN001, ANN202
        _graphs.append(audit(gm).to_dict())
        return compiler(gm, example_inputs)

    torch._dynamo.register_backend(name=RECORD_BACKEND)(record_inductor)


def _count_sync_warnings() -> None:
    import torch

    torch.cuda.set_sync_debug_mode("warn")
    warnings.simplefilter("always")
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if "synchroniz" in str(message):
            _syncs["count"] += 1
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


def _report() -> None:
    report: dict[str, object] = {"rank": int(os.environ.get("RANK", "0"))}
    try:
        import torch
        import torch._inductor.config as inductor_config
        from torch._dynamo.utils import counters

        report["syncs"] = _syncs["count"] if os.environ.get("COUNT_SYNCS") == "1" else None
        report["dynamo"] = {
            "unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "graph_break_reasons": [str(k)[:200] for k in list(counters["graph_break"])[:5]],
        }
        report["emulate_precision_casts"] = bool(inductor_config.emulate_precision_casts)
        if torch.cuda.is_available():
            report["peak_memory_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        if os.environ.get(RECORD_ENV) == "1":
            report["graphs"] = _graphs
    except Exception as exc:  # the report must never hide the run's own outcome
        report["error"] = repr(exc)
    for name, target in (
        ("eager_moe_forwards", "titan_rocm.workarounds.moe_blocks:eager_forward_calls"),
        ("grouped_mm_calls", "titan_rocm.workarounds.grouped_mm:call_counts"),
    ):
        module_name, _, func = target.partition(":")
        module = sys.modules.get(module_name)
        report[name] = getattr(module, func)() if module is not None else None
    print("TITAN_ROCM_RUN_REPORT " + json.dumps(report, default=str), flush=True)


SHIMS_ENV = "TITAN_ROCM_SHIMS"
"""Comma-separated shims to apply before TorchTitan loads; only ``set_timeout`` exists."""


def apply_shims() -> list[str]:
    """The safe shims for this torch: a timeout setter only. Returns what was done.

    TorchTitan 0.3.0's ``set_pg_timeouts`` calls ``torch.distributed.set_timeout`` (torch
    >= 2.14) after step 1; older torch has the same operation as the private
    ``distributed_c10d._set_pg_timeout(timeout, group)``.
    """
    import torch.distributed as dist

    if hasattr(dist, "set_timeout"):
        return []
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        return ["torch.distributed.set_timeout missing and NOT shimmed (no _set_pg_timeout "
                "either): a run fails after step 1"]
    dist.set_timeout = lambda timeout, group=None: setter(timeout, group)
    return ["torch.distributed.set_timeout -> "
            "torch.distributed.distributed_c10d._set_pg_timeout(timeout, group)"]


def main() -> None:
    """Run ``torchtitan.train`` with this process's arguments."""
    if "set_timeout" in os.environ.get(SHIMS_ENV, "").split(","):
        for shim in apply_shims():
            print(f"TITAN_ROCM_SHIM {shim}", flush=True)
    if os.environ.get("COUNT_SYNCS") == "1":
        _count_sync_warnings()
    if os.environ.get(RECORD_ENV) == "1":
        _register_recording_backend()
    atexit.register(_report)
    sys.argv = ["torchtitan.train", *sys.argv[1:]]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
