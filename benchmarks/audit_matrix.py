"""GPU proof of the block-by-block numerics audit: the detection matrix, the clean
distributions the defaults come from, and the audit's memory and time against a step.

One worker process per model (TorchTitan 0.2.2's own ``Trainer``, titan-rocm's converters
with the workarounds forced on (``harness.ROCM_ON``), seed 42, the whole 8 x 2048
micro-batch), on one GPU:

1. **Training**, 11 steps with ``[rocm] numerics_audit = "every_n_steps"`` every 6 steps and
   the default ``numerics_audit_spread`` (``--spread N`` sets it): the in-training audits run
   from step 1 (with the first compile) and from step 6, one part per step; the steps no
   audit touched after the first (5, 10 and 11 with a spread of 4) are the training step
   the second audit's steps are measured against (each step's time and peak memory taken
   around ``train_step``). Runs stored before the spread (no ``schedule`` in the worker's
   JSON) trained 6 steps, audited whole at steps 1 and 4.
2. **The matrix** (``titan_rocm/testing/audit_matrix.py``) on the same trainer, as
   ``titan-rocm audit`` runs it: ``--seeds`` clean audits (new weights and batch each), then
   0.5 %, 1 % and 3 % of the first ``mul`` of the forward and of the backward in the first,
   a middle and the last block. The fault's op is put into the compiled graphs once, before
   the first compile; which block, direction and fraction it corrupts is switched at run time.
3. **The references**: one clean batch audited with each ``numerics_audit_reference``
   (float64, float32, tf32): the eager errors each measures and what each costs.

``--train-fault SPEC`` (``TITAN_ROCM_DEBUG_CORRUPT``'s syntax) switches the test fault on for
the training steps from the second audit on: that audit's parts, one per step, must flag the
fault at the part that replays its block, naming the block and the direction, and no other
block (the figure ``in_training_detection``). With ``--cost`` (no matrix) the fault may sit
at any site, a block's child included (``module=attention,op=mm,index=3``): the part must then
also name that child first wrong (docs/numerics-audit.md#inside-a-block).

``--quarantine`` (with ``--train-fault``) proves ``numerics_audit_policy = "quarantine"``
(docs/numerics-audit.md#quarantine) instead of the matrix: per model two trainings of
``QUARANTINE_STEPS`` steps under that policy, audits begun every ``QUARANTINE_EVERY`` steps
(from step 1), one clean (``NAME-clean``) and one with the fault on from the second audit's
first step (``NAME``), no matrix and no references. The figure ``quarantine``: the flag, the
quarantine line (segment, the flagged micro-batch's time compiled and redone eager), its cost
line, each later audit of the segment, the median unaudited step before and after, the run's
end, and its final loss against the clean run's (``titan-rocm compare``'s relative difference
and default tolerance). ``--clean-runs N`` adds clean repeats for a noise band.

    python -m benchmarks.audit_matrix --out DIR [--only llama3_1b,...] [--seeds 5] [--cost]
                                      [--spread N] [--train-fault SPEC]
    python -m benchmarks.audit_matrix --out DIR --quarantine --train-fault SPEC
                                      [--only llama3_1b,deepseek_v3_4b] [--clean-runs N]
    python -m benchmarks.audit_matrix --reanalyse DIR        # every figure again, on a CPU
    python -m benchmarks.audit_matrix --list

``--sites MODEL[:i,j]`` (with ``--only``: llama3 for ``llama3_1b``, qwen3 for ``qwen3_1.7b``;
``:i,j`` picks sites by index) runs
no training: the clean audits, then each site inside a block of
``titan_rocm.testing.audit_matrix.SITES[MODEL]`` (a rotary multiply, the output projection,
the norms, the SwiGLU multiply) at 0.5 % in the first, a middle and the last block, forward
and backward, as ``titan-rocm audit`` runs them: each must be named at its block, its child
and its direction (docs/numerics-audit.md#inside-a-block).

``--cost`` runs only 1 and the clean audits of 2 (the cost figures, in a fraction of the
time). ``--cpu`` runs the same worker on this machine with the test suite's CPU trainer
(``tests.support.audit_trainer:AuditTrainer``, tiny models): the code path, not the figures.
It proves the audit's verdicts on CUDA, not ROCm: the buffer-store hazard is not reproduced;
the injected fault stands in for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import ROCM_ON, quantile
from titan_rocm.settings import RocmSettings

BUDGET_S = 540.0
TRAIN_STEPS = 11
AUDIT_EVERY = 6
"""The in-training audits begin at steps 1 and 6; the steps neither touched after the first
are plain steps."""
BEFORE_SPREAD = {"steps": 6, "every": 4, "spread": 1}
"""The schedule of runs stored before ``numerics_audit_spread``."""
EPS32 = 2.0 ** -23
"""float32's machine epsilon (``torch.finfo(torch.float32).eps``; a reanalysis needs no torch)."""
REFERENCES = ("float64", "float32", "tf32")
QUARANTINE_STEPS = 24
QUARANTINE_EVERY = 12
"""``--quarantine``: audits begun at steps 1, 12 and 24; the fault on from step 12, so
unaudited steps run on both sides of its quarantine (5 to 11, and from the recheck to 23)."""
QUARANTINE_DEFAULT = ("llama3_1b", "deepseek_v3_4b")


@dataclasses.dataclass(frozen=True)
class Model:
    """A job the benchmark audits."""

    config: str
    flags: tuple[str, ...] = ()
    scope: str = "block"
    """``moe_eager_scope``: deepseek_v3's MoE blocks keep their attention compiled ("moe"),
    so every block has compiled code for the fault to sit in."""
    timeout: int = 300


def family(name: str) -> str:
    """The model code ``MODELS[name]`` trains (``llama3``, ``qwen3``, ``deepseek_v3``)."""
    return Path(MODELS[name].config).name.split("_debug")[0]


MODELS: dict[str, Model] = {
    "llama3_debug": Model("configs/llama3_debug.toml", timeout=200),
    "llama3_1b": Model("configs/llama3_debug.toml", ("--model.flavor", "bench_1B")),
    "qwen3_1.7b": Model("configs/qwen3_debug.toml", ("--model.flavor", "1.7B")),
    "deepseek_v3_4b": Model("configs/deepseek_v3_debug.toml",
                            ("--model.flavor", "bench_moe_4B"), scope="moe", timeout=420),
    # Half the micro-batch (4 x 2048): the whole one's step takes 68 GiB of an H100's 80 and
    # its audit does not fit beside it (it does on an H200).
    "deepseek_v3_4b_half": Model("configs/deepseek_v3_debug.toml",
                                 ("--model.flavor", "bench_moe_4B",
                                  "--training.local_batch_size", "4"), scope="moe", timeout=420),
}
DEFAULT = ("llama3_1b", "qwen3_1.7b", "deepseek_v3_4b")


def schedule_of(quarantine: bool, spread: int | None = None) -> tuple[int, int]:
    """Training steps and the steps between audits: the second audit begins two plain steps
    after the first one's parts end, and two plain steps follow its own."""
    if quarantine:
        return QUARANTINE_STEPS, QUARANTINE_EVERY
    parts = spread if spread else RocmSettings().numerics_audit_spread
    every = max(AUDIT_EVERY, parts + 2)
    return max(TRAIN_STEPS, every + parts + 1), every


def job_flags(model: Model, spread: int | None = None, quarantine: bool = False,
              stock_moe: bool = False) -> list[str]:
    """The job's flags: the model, titan-rocm forced on (``stock_moe``: but MoE blocks compiled
    as stock TorchTitan compiles them), the in-training audit's schedule."""
    steps, every = schedule_of(quarantine, spread)
    return ["--job.config_file", model.config, *model.flags, *ROCM_ON,
            *(["--rocm.moe_eager_compile", "off"] if stock_moe else []),
            "--rocm.moe_eager_scope", model.scope, "--debug.seed", "42",
            "--training.steps", str(steps), "--metrics.log_freq", "1",
            "--checkpoint.no-enable", "--rocm.numerics_audit", "every_n_steps",
            "--rocm.numerics_audit_every", str(every),
            "--experimental.custom_import", "benchmarks.bench_flavors_rocm",
            *(["--rocm.numerics_audit_spread", str(spread)] if spread else []),
            *(["--rocm.numerics_audit_policy", "quarantine"] if quarantine else [])]


# -- the worker (one model, in this process) ------------------------------------------------


def _trim(result: dict[str, Any]) -> dict[str, Any]:
    """An audit's object without what no figure reads (it stays in the log)."""
    keep = ("name", "segment", "kind", "numel", "err_job", "err_eager", "ratio", "score",
            "outlier_fraction", "flagged", "reason", "module")
    out = {k: v for k, v in result.items() if k not in ("tensors", "segments")}
    out["tensors"] = [{k: t[k] for k in keep if k in t} for t in result.get("tensors") or []]
    return out


def worker(name: str, out_file: Path, seeds: int, cpu: bool, cost_only: bool = False,
           spread: int | None = None, train_fault: str | None = None,
           quarantine: bool = False, stock_moe: bool = False, child: str | None = None,
           sites: str | None = None) -> int:
    """Train, run the matrix and the references on one model (only the clean audits with
    ``cost_only``; only the training with ``quarantine``; with ``sites``, no training: the
    clean audits, then each of ``SITES[sites]`` in the first, a middle and the last block);
    write ``out_file`` (JSON)."""
    import torch

    from titan_rocm.adapters.common import single_process_environment

    single_process_environment()
    from torchtitan.tools.logging import init_logger

    init_logger()
    import titan_rocm  # noqa: F401 - registers the converters
    from titan_rocm.adapters.tt022.audit import audit_built
    from titan_rocm.adapters.tt022.config import settings_from
    from titan_rocm.adapters.tt022.converters.converter import JOB_ATTR
    from titan_rocm.testing import audit_matrix, corrupt

    model = MODELS[name]
    fault = corrupt.parse(train_fault) if train_fault else None
    train_steps, every = schedule_of(quarantine, spread)
    if cpu:
        from tests.support import audit_trainer, cpu_trainer

        cpu_trainer.cpu_patches()
        cls = type("Trainer", (audit_trainer.AuditTrainer,), {"n_layers": 3,
                                                              "data_batches": None})
        flags = [*audit_trainer.COMPILED, *audit_trainer.MODELS[family(name)],
                 "--rocm.numerics_audit", "every_n_steps", "--rocm.numerics_audit_every",
                 str(every), "--training.steps", str(train_steps),
                 "--metrics.log_freq", "1", "--rocm.moe_eager_scope", model.scope,
                 *(["--rocm.numerics_audit_spread", str(spread)] if spread else []),
                 *(["--rocm.moe_eager_compile", "off"] if stock_moe else []),
                 *(["--rocm.numerics_audit_policy", "quarantine"] if quarantine else [])]
        jc = cpu_trainer.job_config(flags)
    else:
        from torchtitan.config import ConfigManager
        from torchtitan.train import Trainer as cls

        import benchmarks.bench_flavors_rocm  # noqa: F401 - the bench_* flavors

        jc = ConfigManager().parse_args(job_flags(model, spread, quarantine, stock_moe))
    trainer = cls(jc)
    device = torch.device(getattr(trainer, "device", "cpu"))
    cuda = device.type == "cuda"
    if fault is not None:  # the fault's own site (a child's op, with --cost)
        audit_matrix.install(trainer.model_parts, fault.op, fault.index, fault.module)
    else:
        audit_matrix.install(trainer.model_parts)
    steps: list[dict[str, Any]] = []
    original = trainer.train_step
    peaks: list[int] = []
    monitor = getattr(getattr(trainer, "metrics_processor", None), "device_memory_monitor",
                      None)
    if cuda and monitor is not None:
        # TorchTitan resets the peak when it logs a step (inside train_step): keep it first.
        reset = monitor.reset_peak_stats

        def keep_then_reset(*args: Any, **kwargs: Any) -> Any:
            peaks.append(torch.cuda.max_memory_allocated(device))
            return reset(*args, **kwargs)

        monitor.reset_peak_stats = keep_then_reset

    def timed(*args: Any, **kwargs: Any) -> Any:
        if fault is not None and int(trainer.step) == every:
            corrupt.switch(fault)  # from the second audit on (``train`` counts the step first)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        peaks.clear()
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        peak = max([*peaks, torch.cuda.max_memory_allocated(device)]) if cuda else None
        steps.append({"step": int(trainer.step), "seconds": seconds, "peak_bytes": peak})
        return out

    trainer.train_step = timed
    t0 = time.perf_counter()
    stopped = None
    try:
        if not sites:
            trainer.train()
    except Exception as exc:  # noqa: BLE001 - a stopped run is a figure (quarantine failed)
        if not quarantine:
            raise
        stopped = f"{type(exc).__name__}: {exc}"
        print(f"[{name}] training stopped: {stopped}", flush=True)
    train_s = time.perf_counter() - t0
    corrupt.switch(None)
    job = trainer.model_parts[0].__dict__.get(JOB_ATTR)
    audit = job.instances.get("numerics_audit") if job is not None else None
    in_training = [_trim(r) for r in (audit.results if audit is not None else [])]
    settings = settings_from(jc)
    # A ``titan-rocm audit`` process starts without gradients: the last step's go, so the
    # command-line audits below are not measured on top of them (the optimizer's state
    # stays, which such a process does not have: their memory is an upper bound).
    for part in trainer.model_parts:
        for p in part.parameters():
            p.grad = None
    batches = iter(trainer.dataloader)
    state: dict[str, Any] = {}

    def reseed(seed: int) -> None:
        torch.manual_seed(seed)
        with torch.no_grad():
            trainer.model_parts[0].init_weights(buffer_device=None)
        state["batch"] = next(batches)

    def one() -> dict[str, Any]:
        return audit_built(trainer, settings, *state["batch"]).to_dict()

    keys = [k for k, _ in trainer.model_parts[0].layers.named_children()]
    specs = [] if cost_only or quarantine or sites else audit_matrix.fault_specs(
        audit_matrix.first_middle_last(keys))

    def matrix() -> list[dict[str, Any]]:
        return [{**o.to_dict(), "result": _trim(o.result)} for o in outcomes]

    def said(o: audit_matrix.Outcome) -> None:
        print(f"[{name}] {o.spec} seed={o.seed}: {o.verdict} right={o.judged['right']} "
              f"{o.seconds:.1f}s", flush=True)

    outcomes = audit_matrix.run(one, specs, [] if quarantine else list(range(seeds)), reseed,
                                on_outcome=said)
    for site in site_list(sites) if sites else ():
        # A site is a new fault op in the graphs: the job's blocks and the probed copy compile
        # again (the same trainer, weights and batch).
        corrupt.uninstall()
        torch._dynamo.reset()
        audit_matrix.install(trainer.model_parts, site.op, site.index, site.module)
        outcomes += audit_matrix.run(one, site.specs(site.blocks(trainer.model_parts)), [],
                                     reseed, on_outcome=said, child=site.child)
        # What ran so far, should the call's time run out before the last site.
        out_file.write_text(json.dumps({"model": name, "cpu": cpu, "sites": sites,
                                        "partial": True, "matrix": matrix()}, default=str))
    references = {}
    reseed(0)
    for choice in () if cost_only or quarantine or sites else REFERENCES:
        chosen = dataclasses.replace(settings, numerics_audit_reference=choice)
        try:
            references[choice] = _trim(audit_built(trainer, chosen, *state["batch"]).to_dict())
        except Exception as exc:  # noqa: BLE001 - a reference that does not fit is a figure
            references[choice] = {"error": f"{type(exc).__name__}: {exc}"}
    trainer.close()
    out = {"model": name, "cpu": cpu, "steps": steps, "train_s": train_s,
           "schedule": {"steps": train_steps, "every": every,
                        "spread": settings.numerics_audit_spread,
                        **({"policy": "quarantine"} if quarantine else {})},
           **({"stopped": stopped} if quarantine else {}),
           **({"quarantined": dict(audit.quarantined)} if quarantine and audit else {}),
           **({"train_fault": {**fault.to_dict(), **({"child": child} if child else {})}}
              if fault is not None else {}),
           **({"moe_compile": "stock"} if stock_moe else {}),
           **({"sites": sites} if sites else {}),
           "in_training": in_training, "references": references,
           "matrix": matrix()}
    out_file.write_text(json.dumps(out, default=str))
    print(f"[{name}] wrote {out_file}", flush=True)
    return 0


# -- the figures ------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


_CHILD = re.compile(r"^layers\.[^. ]+\.\S+ (output|input grad)$")
_NOT_COMPARED_NOW = (".moe.router output",)
"""Compared by runs stored before a child's tuple output was left out of the comparison (the
router's scores beside its expert indices: a top-k choice that rounding flips moves them);
the audit compares them no longer, so no default is drawn from them."""


def is_child(tensor: dict[str, Any]) -> bool:
    """A block child's tensor: its ``module`` key, or in a run stored before the key, its name
    (``layers.K.<child> output`` / ``input grad``, a parameter's ``... (alone)``)."""
    return "module" in tensor or tensor["name"].endswith(" (alone)") or bool(
        _CHILD.match(tensor["name"]))


def needed(tensor: dict[str, Any], floor: float) -> float | None:
    """The least multiplier of the eager error that keeps ``tensor``'s rmse test unflagged:
    ``(err_job - floor) / err_eager`` (None: not finite, or no eager error)."""
    job, eager = _number(tensor.get("err_job")), _number(tensor.get("err_eager"))
    if job is None or eager is None or not eager or not math.isfinite(job / eager):
        return None
    return (job - floor) / eager


def distributions(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tensor kind over clean audits (a block child's as ``child_<kind>``): ``err_job /
    err_eager`` and the outlier fraction, median, p99 and max (with the worst tensor's name),
    and the largest multiplier a tensor of the kind needed to stay ok (``needed_max``, the
    figure the kind's default is drawn from)."""
    out: dict[str, Any] = {}
    kinds: dict[str, list[tuple[float, float, str, float | None]]] = {}
    for r in results:
        floor = float((r.get("settings") or {}).get("floor_eps", 64.0)) * EPS32
        for t in r.get("tensors") or []:
            if t["name"].endswith(_NOT_COMPARED_NOW):
                continue
            ratio, outliers = _number(t.get("ratio")), _number(t.get("outlier_fraction"))
            if ratio is not None and outliers is not None and t.get("numel"):
                kind = f"child_{t['kind']}" if is_child(t) else t["kind"]
                need = needed(t, floor) if t["kind"] != "loss" else None  # its own floor
                kinds.setdefault(kind, []).append((ratio, outliers, t["name"], need))
    for kind, rows in sorted(kinds.items()):
        ratios = [r for r, _, _, _ in rows]
        fractions = [f for _, f, _, _ in rows]
        worst = max(rows, key=lambda row: row[:3])
        need = max(((n, name) for _, _, name, n in rows if n is not None), default=None)
        out[kind] = {"tensors": len(rows), "ratio_median": statistics.median(ratios),
                     "ratio_p99": quantile(ratios, 0.99), "ratio_max": worst[0],
                     "ratio_worst": worst[2], "outliers_median": statistics.median(fractions),
                     "outliers_p99": quantile(fractions, 0.99),
                     "outliers_max": max(fractions),
                     "needed_max": need and need[0], "needed_worst": need and need[1]}
    return out


def site_list(text: str) -> list[Any]:
    """``MODEL`` or ``MODEL:i,j``: those sites of ``SITES[MODEL]`` (ValueError naming the bad
    part)."""
    from titan_rocm.testing.audit_matrix import SITES

    model, _, picked = text.partition(":")
    if model not in SITES:
        raise ValueError(f"--sites {text}: {model!r} has no sites; accepted: "
                         f"{', '.join(SITES)}, optionally :i,j (site indices)")
    sites = SITES[model]
    if not picked:
        return list(sites)
    bad = ValueError(f"--sites {text}: accepted site indices for {model}: 0 to "
                     f"{len(sites) - 1}, comma-separated")
    try:
        indices = [int(i) for i in picked.split(",")]
    except ValueError:
        raise bad from None
    if any(not 0 <= i < len(sites) for i in indices):
        raise bad
    return [sites[i] for i in indices]


def clean_in_training(worker_out: dict[str, Any]) -> list[dict[str, Any]]:
    """The in-training audits no fault touched: all of them, or with ``--train-fault`` those
    before the second audit (the fault is switched on there)."""
    every = (worker_out.get("schedule") or BEFORE_SPREAD)["every"]
    return [r for r in worker_out.get("in_training") or []
            if not worker_out.get("train_fault") or (r.get("step") or 0) < every]


def cost(worker_out: dict[str, Any]) -> dict[str, Any]:
    """The training step (the steps after the first no audit touched: median time, max
    peak), the second in-training audit's steps against it (the most any one of them added,
    in steps, and with a spread the sum), and the command-line audits' time and peak against
    it."""
    schedule = worker_out.get("schedule") or BEFORE_SPREAD
    steps = {s["step"]: s for s in worker_out.get("steps") or []}
    in_training = worker_out.get("in_training") or []
    touched = {r.get("step") for r in in_training}
    if schedule == BEFORE_SPREAD:  # whole audits at 1 and 4 (a skipped one still costs)
        touched |= {1, schedule["every"]}
    plain = [steps[s] for s in sorted(steps) if s > 1 and s not in touched]
    if not plain:
        return {}
    step_s = statistics.median(s["seconds"] for s in plain)
    peaks = [s["peak_bytes"] for s in plain if s.get("peak_bytes")]
    step_peak = max(peaks) if peaks else None
    out: dict[str, Any] = {"step_s": step_s, "step_peak_gib": step_peak and step_peak / 2**30}
    # The second audit (the first compiles): its parts' steps, where its time and memory went.
    later = second_audit(worker_out)
    audited = [steps[s] for s in sorted({r["step"] for r in later}) if s in steps] or (
        [steps[schedule["every"]]] if schedule["every"] in steps else [])
    if later:
        times: dict[str, float] = {}
        for r in later:
            for k, v in (r.get("time_s") or {}).items():
                times[k] = times.get(k, 0.0) + v
        out["in_training_time_s"] = times
        out["in_training_memory"] = later[0].get("memory")
    if audited:
        extras = [(a["seconds"] - step_s) / step_s for a in audited]
        out["in_training_extra_steps"] = max(extras)
        if len(audited) > 1:
            out["in_training_parts"] = len(audited)
            out["in_training_extra_steps_each"] = extras
            # fsum: the same last bit on every Python (3.12's sum compensates, 3.11's not).
            out["in_training_extra_steps_total"] = math.fsum(extras)
        audit_peaks = [a["peak_bytes"] for a in audited if a.get("peak_bytes")]
        if step_peak and audit_peaks:
            out["in_training_peak_ratio"] = max(audit_peaks) / step_peak
    # The first audit (cold): part 1 runs at step 1 beside the job's own compile, so its own
    # time is the figure; the later parts are measured against the step as the second's are.
    first = [r for r in in_training if r.get("part") and (r.get("step") or 0) < schedule["every"]]
    if len(first) > 1:
        part1 = first[0].get("time_s") or {}
        out["first_audit_part1_s"] = part1.get("total")
        if part1.get("total") is not None and part1.get("job") is not None:
            # Its log line's total holds the job's own pass of step 1 (the job's first
            # compile, which the job runs anyway): what the audit adds is the rest.
            out["first_audit_part1_audit_s"] = part1["total"] - part1["job"]
            out["first_audit_part1_audit_steps"] = out["first_audit_part1_audit_s"] / step_s
            out["first_audit_part1_children_compiled_s"] = part1.get("children_compiled")
        out["first_audit_extra_steps_each"] = [(steps[r["step"]]["seconds"] - step_s) / step_s
                                               for r in first[1:] if r["step"] in steps]
    clean = [m["result"] for m in worker_out.get("matrix") or [] if m["spec"] is None]
    if clean:
        totals = [r["time_s"]["total"] for r in clean[1:] or clean]  # the first compiles
        out["cli_audit_s_median"] = statistics.median(totals)
        out["cli_audit_over_step"] = out["cli_audit_s_median"] / step_s
        audit_peaks = [r["peak_memory_bytes"] for r in clean if r.get("peak_memory_bytes")]
        if audit_peaks and step_peak:
            out["cli_audit_peak_ratio"] = max(audit_peaks) / step_peak
        out["chunks"] = sorted({r.get("chunks") for r in clean})
        out["cli_memory"] = clean[-1].get("memory")
    return out


def second_audit(worker_out: dict[str, Any]) -> list[dict[str, Any]]:
    """The in-training audit begun at the second due step: its parts, in step order."""
    every = (worker_out.get("schedule") or BEFORE_SPREAD)["every"]
    later = [r for r in worker_out.get("in_training") or [] if (r.get("step") or 0) >= every]
    return later[:next((i for i, r in enumerate(later) if i and (r.get("part") or {}).get(
        "part") == 1), len(later))]


def in_training_detection(worker_out: dict[str, Any]) -> dict[str, Any]:
    """With ``--train-fault``: each part of the second audit (step, blocks, verdict, first
    wrong), and whether it is right: the part that replays the fault's block flags it there
    in its direction (a backward fault with the forward clean), and no part names another
    block (the end-to-end loss a forward fault moves names none)."""
    from titan_rocm.testing.audit_matrix import within

    spec = worker_out["train_fault"]
    key, graph = str(spec["block"]), spec["graph"]
    child = spec.get("child") or (spec["module"].split(".")[0] if spec.get("module") else None)
    parts = [{"step": r.get("step"), "blocks": (r.get("part") or {}).get("blocks"),
              "verdict": r.get("verdict"), "first_wrong": r.get("first_wrong") or {},
              **({"first_wrong_module": r.get("first_wrong_module") or {}} if child else {})}
             for r in second_audit(worker_out)]
    mine = [p for p in parts if p["blocks"] is None or key in p["blocks"]]
    named = bool(mine) and all(
        p["verdict"] == "flagged" and p["first_wrong"].get(graph) == key
        and (child is None or within(p["first_wrong_module"].get(graph), child))
        and (graph == "forward" or p["first_wrong"].get("forward") is None) for p in mine)
    elsewhere = [b for p in parts for b in p["first_wrong"].values()
                 if b is not None and b != key]
    return {"spec": spec, "parts": parts, "right": named and not elsewhere}


def fault_size(outcome: dict[str, Any]) -> float | None:
    """The fault's change over the norm of the op's output it ran on (None for a clean audit,
    for runs stored before the fault measured it, and where the sums are not finite: runs
    stored before they left out a grouped GEMM's unwritten rows)."""
    from titan_rocm.testing.corrupt import Hits

    hits = outcome.get("hits") or {}
    change, output = hits.get("change_sq"), hits.get("output_sq")
    if not output or not math.isfinite(output) or change is None or not math.isfinite(change):
        return None
    return Hits(**hits).relative_change  # the log line's figure, one formula


def detection(worker_out: dict[str, Any]) -> dict[str, Any]:
    """The matrix: each audit right or not, clean false positives, faults missed or
    misnamed."""
    matrix = worker_out.get("matrix") or []
    faults = [m for m in matrix if m["spec"] is not None]
    clean = [m for m in matrix if m["spec"] is None]
    return {"faults": len(faults), "faults_right": sum(m["judged"]["right"] for m in faults),
            "clean": len(clean), "false_positives": sum(not m["judged"]["right"]
                                                        for m in clean),
            "wrong": [{"spec": m["spec"], "seed": m["seed"], "judged": m["judged"],
                       **({"fault_size": size} if (size := fault_size(m)) is not None else {})}
                      for m in matrix if not m["judged"]["right"]],
            "weakest_fault_score": min(
                (max(_number(t["score"]) or 0.0 for t in m["result"]["tensors"])
                 for m in faults), default=None),
            **({"named_fault_size_min": min(sizes)} if (sizes := [
                size for m in faults if m["judged"]["right"]
                and (size := fault_size(m)) is not None]) else {})}


def reference_figures(worker_out: dict[str, Any]) -> dict[str, Any]:
    """Each reference's eager errors against float64's (median and max of the ratio over the
    tensors both measured), and its time."""
    refs = worker_out.get("references") or {}
    base = {t["name"]: _number(t["err_eager"]) for t in (refs.get("float64") or {}).get(
        "tensors", [])}
    out = {}
    for choice, r in refs.items():
        if r.get("error"):
            out[choice] = {"error": r["error"]}
            continue
        ratios = [e / base[t["name"]] for t in r["tensors"]
                  if (e := _number(t["err_eager"])) and base.get(t["name"])]
        out[choice] = {"reference": r.get("reference"), "verdict": r.get("verdict"),
                       "time_s": r["time_s"].get("total"),
                       "err_eager_over_float64_median": statistics.median(ratios) if ratios
                       else None, "err_eager_over_float64_max": max(ratios) if ratios else None}
    return out


_MICRO = re.compile(r"took (?P<before>[0-9.]+) s compiled, (?P<after>[0-9.]+) s with it eager")
_COST = re.compile(r"quarantined (?P<segment>.+?) costs (?P<ratio>[0-9.]+|nan) x the step time "
                   r"\((?P<after>[0-9.]+) s against (?P<before>[0-9.]+) s, mean of "
                   r"(?P<steps>[0-9]+) unaudited")
_CONFIRMED = re.compile(r"titan-rocm: the quarantined (?P<segment>.+?) is ok at step "
                        r"(?P<step>[0-9]+)")


def _losses(text: str) -> dict[int, float]:
    """Each step's loss in a training log (rank 0's, or the untagged one)."""
    from titan_rocm.logs.parse import parse_text

    return {r.step: r.loss for r in parse_text(text).train_records
            if r.rank in (None, 0) and r.loss is not None}


def _covers(result: dict[str, Any], segments: set[str]) -> bool:
    """Whether an in-training audit (its trimmed object) replayed any of ``segments``."""
    part = result.get("part")
    if part is None:
        return True
    return bool(segments & set(part.get("blocks") or [])) or (
        bool(part.get("outside")) and bool(segments & {"embedding", "head"}))


def quarantine_figures(w: dict[str, Any], cleans: list[dict[str, Any]]) -> dict[str, Any]:
    """``--quarantine``: the fault run ``w`` against its clean runs (each worker's JSON with
    its log's text under ``log``): the flag, the quarantine and cost lines, the later audits
    of the quarantined segments, unaudited step times before and after, the run's end and its
    final loss against the clean run's (``compare``'s relative difference; the band from the
    clean repeats, at least compare's default tolerance)."""
    from titan_rocm import audit_message
    from titan_rocm.logs.compare import DEFAULT_TOLERANCE_PCT, noise_band, relative

    text = w.get("log") or ""
    results = w.get("in_training") or []
    flags = [{"step": r.get("step"), "first_wrong": r.get("first_wrong")}
             for r in results if r.get("verdict") == "flagged"]
    lines = []
    for line in text.splitlines():
        found = audit_message.QUARANTINED.search(line)
        micro = _MICRO.search(line)
        if found:
            lines.append({"step": int(found["step"]), "segment": found["segment"],
                          "micro_batch_s": {"compiled": float(micro["before"]),
                                            "eager": float(micro["after"])} if micro else None})
    cost_lines = [{"segment": m["segment"], "ratio": float(m["ratio"]),
                   "before_s": float(m["before"]), "after_s": float(m["after"]),
                   "steps": int(m["steps"])} for m in map(_COST.search, text.splitlines()) if m]
    confirmed = [{"segment": m["segment"], "step": int(m["step"])}
                 for m in map(_CONFIRMED.search, text.splitlines()) if m]
    first = min((q["step"] for q in lines), default=None)
    keys = set(w.get("quarantined") or {})
    later = [{"step": r.get("step"), "verdict": r.get("verdict")} for r in results
             if first is not None and (r.get("step") or 0) > first and _covers(r, keys)]
    touched = {r.get("step") for r in results}
    plain = {s["step"]: s["seconds"] for s in w.get("steps") or []
             if s["step"] > 1 and s["step"] not in touched}
    before = [v for k, v in plain.items() if first is not None and k < first]
    after = [v for k, v in plain.items() if first is not None and k > first]
    out: dict[str, Any] = {
        "fault": w.get("train_fault"), "flags": flags, "quarantined": lines,
        "cost_lines": cost_lines, "confirmed": confirmed, "later_audits": later,
        "later_audits_ok": bool(later) and all(r["verdict"] == "ok" for r in later),
        "step_s_before": statistics.median(before) if before else None,
        "step_s_after": statistics.median(after) if after else None,
        "unaudited_steps": [len(before), len(after)],
        "stopped": w.get("stopped"),
    }
    if before and after:
        out["step_ratio"] = out["step_s_after"] / out["step_s_before"]
    losses = _losses(text)
    clean = [_losses(c.get("log") or "") for c in cleans]
    steps = (w.get("schedule") or {}).get("steps")
    out["trained_to_the_end"] = bool(losses) and max(losses) == steps
    if losses and clean and clean[0]:
        base = clean[0]
        diff = relative(base, losses)
        band = noise_band(base, clean[1:], DEFAULT_TOLERANCE_PCT / 100)
        last = max(set(base) & set(losses))
        out["final_loss"] = {"step": last, "run": losses[last], "clean": base[last],
                             "relative": diff.values[-1] if diff.values else None,
                             "band": band.values[-1] if band.values else None,
                             "clean_repeats": len(clean) - 1}
        out["final_loss"]["within_band"] = (out["final_loss"]["relative"] is not None and abs(
            out["final_loss"]["relative"]) <= out["final_loss"]["band"])
    return out


def figures(workers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every figure, per model."""
    out = {}
    for name, w in workers.items():
        if (w.get("schedule") or {}).get("policy") == "quarantine":
            cleans = [workers[n] for n in sorted(workers) if n.startswith(f"{name}-clean")]
            if w.get("train_fault"):
                out[name] = {"quarantine": quarantine_figures(w, cleans),
                             "in_training_verdicts": [r.get("verdict") for r in
                                                      w.get("in_training") or []]}
            else:
                out[name] = {"in_training_verdicts": [r.get("verdict") for r in
                                                      w.get("in_training") or []]}
            continue
        clean = [m["result"] for m in w.get("matrix") or [] if m["spec"] is None]
        out[name] = {"detection": detection(w), "clean": distributions(clean),
                     "clean_in_training": distributions(clean_in_training(w)),
                     "cost": cost(w), "references": reference_figures(w),
                     "in_training_verdicts": [r.get("verdict") for r in w.get("in_training")
                                              or []]}
        if w.get("train_fault"):
            out[name]["in_training_detection"] = in_training_detection(w)
    return out


DEFAULT_OF_KIND = {"output": "activation_fudge", "input_grad": "activation_fudge",
                   "param_grad": "fudge", "child_output": "child_activation_fudge",
                   "child_input_grad": "child_activation_fudge",
                   "child_param_grad": "child_fudge"}
"""The multiplier each kind is judged with (``[rocm] numerics_audit_<name>``)."""


def calibration(directories: list[Path]) -> dict[str, Any]:
    """Per tensor kind over every clean audit of the stored runs ``directories`` (their
    command-line clean audits and the in-training audits no fault touched): the tensors, the
    largest multiplier one needed (where), and the default against it."""
    defaults = RocmSettings()
    out: dict[str, Any] = {}
    for directory in directories:
        for model, f in reanalyse(directory)["figures"].items():
            for source in ("clean", "clean_in_training"):
                for kind, d in (f.get(source) or {}).items():
                    if kind not in DEFAULT_OF_KIND:
                        continue
                    row = out.setdefault(kind, {"tensors": 0, "needed_max": None,
                                                "needed_worst": None})
                    row["tensors"] += d["tensors"]
                    if d["needed_max"] is not None and (row["needed_max"] is None
                                                        or d["needed_max"] > row["needed_max"]):
                        row["needed_max"] = d["needed_max"]
                        row["needed_worst"] = f"{directory.name} {model} {d['needed_worst']}"
    for kind, row in out.items():
        row["setting"] = f"numerics_audit_{DEFAULT_OF_KIND[kind]}"
        row["default"] = getattr(defaults, row["setting"])
        row["margin"] = row["needed_max"] and row["default"] / row["needed_max"]
    return dict(sorted(out.items()))


# -- running and storing ------------------------------------------------------------------------


def launch(name: str, logs: Path, seeds: int, cpu: bool, timeout: float,
           cost_only: bool = False, spread: int | None = None,
           train_fault: str | None = None, quarantine: bool = False,
           label: str | None = None, stock_moe: bool = False,
           child: str | None = None, sites: str | None = None,
           cache: Path | None = None) -> dict[str, Any]:
    """One worker process, with fresh caches unless ``cache`` (Inductor's and Triton's, on
    disk) is given; its log and JSON go under ``logs`` (named ``label``, default the model's
    name)."""
    label = label or name
    result = logs / f"{label}.json"
    cmd = [sys.executable, "-m", "benchmarks.audit_matrix", "--worker", name, "--result",
           str(result), "--seeds", str(seeds), *(["--cpu"] if cpu else []),
           *(["--cost"] if cost_only else []), *(["--spread", str(spread)] if spread else []),
           *(["--train-fault", train_fault] if train_fault else []),
           *(["--quarantine"] if quarantine else []),
           *(["--stock-moe"] if stock_moe else []), *(["--child", child] if child else []),
           *(["--sites", sites] if sites else [])]
    env = harness.child_env(cache or harness.fresh_dir(f"audit-{label}"))
    code, wall = harness.run_logged(cmd, logs / f"{label}.log", env, timeout)
    return {"name": label, "exit": code, "wall_s": round(wall, 1)}


def read_workers(logs: Path, runs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each finished worker's JSON."""
    out = {}
    for name in runs:
        path = logs / f"{name}.json"
        if path.is_file():
            out[name] = json.loads(path.read_text())
            log = logs / f"{name}.log"
            if (out[name].get("schedule") or {}).get("policy") == "quarantine" and log.is_file():
                out[name]["log"] = log.read_text(errors="replace")
    return out


def reanalyse(directory: Path) -> dict[str, Any]:
    """Every figure again from a stored result (summary.json + logs.tar.gz), on any machine."""
    with harness.open_stored(directory) as (stored, logs):
        runs = stored.get("runs", {})
        return {"environment": stored.get("environment"),
                "figures": figures(read_workers(logs, runs)), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    """Run the workers (or one worker), or reanalyse / list."""
    parser = harness.parser(__doc__)
    parser.add_argument("--only", help="comma-separated models (default: "
                        f"{','.join(DEFAULT)})")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cost", action="store_true",
                        help="only the in-training audit and the clean audits (no faults, "
                        "no references)")
    parser.add_argument("--spread", type=int, default=None,
                        help="the training's numerics_audit_spread (default: the setting's)")
    parser.add_argument("--train-fault", metavar="SPEC",
                        help="the test fault (TITAN_ROCM_DEBUG_CORRUPT's syntax) on from the "
                        "second in-training audit's first step")
    parser.add_argument("--sites", metavar="MODEL[:i,j]",
                        help="instead of training and the block matrix: the clean audits, "
                        "then each site inside a block of titan_rocm.testing.audit_matrix."
                        "SITES[MODEL] at 0.5 %% in the first, a middle and the last block, "
                        "forward and backward, as titan-rocm audit runs them")
    parser.add_argument("--stock-moe", action="store_true",
                        help="MoE blocks compiled as stock TorchTitan 0.2.2 compiles them "
                        "(each child alone; rocm.moe_eager_compile off)")
    parser.add_argument("--child", metavar="NAME",
                        help="with --train-fault and --cost: the block's child the fault sits "
                        "in, where the site names none (a separately compiled child of a "
                        "stock MoE block: --child moe)")
    parser.add_argument("--quarantine", action="store_true",
                        help="with --train-fault: the quarantine policy's proof (a clean and "
                        "a faulty training per model, no matrix)")
    parser.add_argument("--clean-runs", type=int, default=1, metavar="N",
                        help="--quarantine: clean trainings per model (2 or more: a noise "
                        "band from the repeats; default 1)")
    parser.add_argument("--warm", action="store_true",
                        help="each model's worker again, after the first, with the first's "
                        "Inductor and Triton caches on disk (a job restarted on the same "
                        "machine): NAME-warm")
    parser.add_argument("--cpu", action="store_true",
                        help="the CPU test trainer instead of TorchTitan's (code path only)")
    harness.add_budget(parser, None,
                       f"seconds for the whole call (default {BUDGET_S:.0f}; --cpu: none)")
    parser.add_argument("--calibration", type=Path, nargs="+", metavar="DIR",
                        help="per tensor kind, the largest multiplier a clean tensor of the "
                        "stored runs DIR... needed, against its default (no GPU)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.result, args.seeds, args.cpu, args.cost, args.spread,
                      args.train_fault, args.quarantine, args.stock_moe, args.child,
                      args.sites)
    if args.reanalyse:
        return harness.print_reanalysis(parser, reanalyse, args.reanalyse)
    if args.calibration:
        return harness.print_reanalysis(parser, calibration, args.calibration)
    if args.quarantine and not args.train_fault:
        parser.error("--quarantine needs --train-fault SPEC (the fault to quarantine)")
    if args.child and not (args.train_fault and args.cost):
        parser.error(f"--child {args.child} needs --train-fault SPEC and --cost")
    if args.sites:
        try:
            site_list(args.sites)
        except ValueError as exc:
            parser.error(str(exc))
        if args.quarantine or args.train_fault:
            parser.error("--sites runs no training: not with --quarantine or --train-fault")
        # A site no module places sits in a child the stock MoE compile compiles alone.
        if any(s.module is None for s in site_list(args.sites)) and not args.stock_moe:
            parser.error(f"--sites {args.sites} needs --stock-moe: the mixed compile keeps the "
                         "MoE blocks eager, with no compiled kernel inside for a fault")
        if args.seeds < 1:  # the clean audit draws the batch every site's faults use
            parser.error(f"--sites needs --seeds 1 or more (got {args.seeds}): its clean "
                         "audit draws the batch the sites are audited on")
    if args.warm and not args.cost:
        parser.error("--warm measures what a restarted job's audits cost: it goes with "
                     "--cost (accepted: --cost --warm)")
    if args.clean_runs < 1:
        parser.error(f"--clean-runs {args.clean_runs} is not valid; accepted: an integer >= 1")
    names = args.only.split(",") if args.only else list(
        QUARANTINE_DEFAULT if args.quarantine else DEFAULT)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"--only {','.join(unknown)}: accepted: {', '.join(MODELS)}")
    if args.sites:  # a site counts ops of its own model's code
        sites_of = args.sites.partition(":")[0]
        other = [n for n in names if family(n) != sites_of]
        if other:
            fits = [n for n in MODELS if family(n) == sites_of]
            parser.error(f"--sites {args.sites} with --only {','.join(other)}: its sites are "
                         f"{sites_of}'s; accepted: --only {', '.join(fits)}")
    if args.train_fault:
        from titan_rocm.testing import corrupt

        try:
            spec = corrupt.parse(args.train_fault)
        except corrupt.CorruptSpecError as exc:
            parser.error(f"--train-fault: {exc}")
        if (spec.module, spec.op, spec.index) != (None, "mul", 0) and not args.cost:
            parser.error(f"--train-fault {args.train_fault}: the matrix's fault op is "
                         "aten.mul #0 (op=mul,index=0); accepted: any block, graph, fraction, "
                         "or with --cost (no matrix) any module, op and index")
    if args.list:
        for n in names:
            flags = job_flags(MODELS[n], args.spread, args.quarantine, args.stock_moe)
            print(f"{n}: {' '.join(flags)}")
        return 0
    out = harness.require_out(parser, args)
    budget = args.budget_s if args.budget_s is not None else (None if args.cpu else BUDGET_S)
    call = harness.Call(out, lambda c: {"environment": c.environment, "runs": c.results,
                                        "figures": figures(read_workers(c.logs, c.results))},
                        budget_s=budget, seeds=args.seeds, cpu=args.cpu, cost=args.cost)
    for name in names:
        timeout = MODELS[name].timeout * (10 if args.cpu else 1)  # a CPU compiles slowly
        if args.sites:  # each site compiles the job's blocks and the probed copy again
            timeout = max(timeout, 520)
        if args.quarantine:
            labels = [f"{name}-clean" + (str(k + 1) if k else "")
                      for k in range(args.clean_runs)] + [name]
            for label in labels:
                if call.skip_unless(label, 60):
                    continue
                run = call.record(label, launch(
                    name, call.logs, 0, args.cpu, min(call.left_s(), timeout), spread=args.spread,
                    train_fault=None if label != name else args.train_fault, quarantine=True,
                    label=label))["runs"][label]
                print(f"[{label}] exit={run['exit']} wall={run['wall_s']}s", flush=True)
            continue
        cache = harness.fresh_dir(f"audit-{name}")
        for label in (name, f"{name}-warm") if args.warm else (name,):
            if call.skip_unless(label, 60):
                continue
            run = call.record(label, launch(name, call.logs, args.seeds, args.cpu,
                                            min(call.left_s(), timeout), args.cost,
                                            args.spread, args.train_fault,
                                            label=label, stock_moe=args.stock_moe,
                                            child=args.child, sites=args.sites,
                                            cache=cache))["runs"][label]
            print(f"[{label}] exit={run['exit']} wall={run['wall_s']}s", flush=True)
    print(json.dumps(figures(read_workers(call.logs, call.results)), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
