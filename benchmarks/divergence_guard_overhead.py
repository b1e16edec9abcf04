"""rocm.divergence_guard on a GPU: overhead side by side, NaN injection, and no-sync proof.

Runs, in one call, TorchTitan 0.2.2 (``python -m titan_rocm.train``) on ``--config`` with the
guard off, in ``log_steps``, ``every_step`` and ``every_step_exact`` mode (the same job
otherwise), then
prints each run's median tokens/s after warm-up (``titan-rocm bench-summary``) and the
ratios to the guard-off run. Then a run with the test hook ``TITAN_ROCM_DEBUG_INJECT_NAN_STEP``
(NaN at step 7, ``log_freq`` 10) must stop non-zero, naming step 7, found at log step 10, and
``titan-rocm check-log`` must fail its log. Before all that, the guard's per-step record
updates run under ``torch.cuda.set_sync_debug_mode("error")``: any device-to-host sync
raises.

    python -m benchmarks.divergence_guard_overhead --ngpu 1 --out /tmp/guard
    python -m benchmarks.divergence_guard_overhead --ngpu 2 --out /tmp/guard2   # FSDP

Run from the repository root (the debug configs' tokenizer and dataset paths are relative).
The GPU-bound figures (llama3 1.5B, mirrored, ``--reanalyse``) come from
``python -m benchmarks.gpu_validation --suite throughput --models llama3_1b_guard``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import harness
from titan_rocm.logs.check import check_file
from titan_rocm.logs.parse import parse_file
from titan_rocm.logs.summary import summarize

VARIANTS: dict[str, list[str]] = {
    "guard off": ["--rocm.divergence_guard", "off"],
    "log_steps": ["--rocm.divergence_check", "log_steps"],
    "every_step": ["--rocm.divergence_check", "every_step"],
    "every_step_exact": ["--rocm.divergence_check", "every_step_exact"],
}


def sync_check() -> str:
    """The record's per-step updates on CUDA under sync debug mode "error"."""
    import torch

    from titan_rocm.workarounds.divergence_guard.record import NonFiniteRecord

    record = NonFiniteRecord()
    loss = torch.tensor(4.0, device="cuda")
    labels = torch.ones(8, 2048, dtype=torch.long, device="cuda")
    record.observe_loss(loss, labels)  # first use allocates; warm up outside the check
    record.observe_grad_norm(loss)
    record.end_step(0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 101):
            record.observe_loss(loss * (float("nan") if step == 7 else 1.0), labels)
            record.observe_grad_norm(loss)
            record.end_step(step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    row = record.row()
    assert row.step == 7, row
    return f"sync check: 100 record updates under set_sync_debug_mode('error'): no sync; {row}"


def train(name: str, extra: list[str], args: argparse.Namespace, env: dict[str, str]) -> tuple:
    """One run of ``--config`` with the guard and ``extra``: its log, exit code, seconds."""
    log = args.out / f"{name.replace(' ', '_')}.log"
    cmd = harness.torchrun(args.ngpu, "-m", "titan_rocm.train", "--job.config_file", args.config,
                           "--model.converters", "rocm.divergence_guard",
                           "--training.steps", str(args.steps), "--metrics.log_freq", "10",
                           *extra)
    code, seconds = harness.run_logged(cmd, log, env, None)
    return log, code, seconds


def main() -> int:
    """The sync check, the overhead runs, then the injection run; 0 when all passed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/llama3_debug.toml")
    parser.add_argument("--ngpu", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each variant (0: no overhead runs)")
    parser.add_argument("--out", type=Path, default=Path("outputs/guard_overhead"))
    parser.add_argument("--inject-only", action="store_true",
                        help="skip the sync check and the overhead runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in harness.child_env().items() if not k.startswith("TITAN_ROCM_DEBUG")}
    if not args.inject_only:
        print(sync_check(), flush=True)
        if overhead(args, env):
            return 1
    return inject(args, env)


def overhead(args: argparse.Namespace, env: dict[str, str]) -> int:
    """Guard off / log_steps / every_step, interleaved; print medians and ratios."""
    if args.repeats < 1:
        return 0
    medians: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for repeat in range(args.repeats):  # interleaved, so drift hits every variant alike
        for name, extra in VARIANTS.items():
            log, rc, secs = train(f"{name}_{repeat}", extra, args, env)
            summary = summarize([parse_file(log)], warmup=args.warmup)
            tps = summary.stats.get("tps") if summary.valid and summary.stats else None
            print(f"{name:>10} run {repeat}: rc={rc} {secs:.0f}s valid={summary.valid} "
                  f"median tps={tps.median if tps else None} ({log})", flush=True)
            if rc != 0 or tps is None:
                print(f"FAILED: {summary.reason}", flush=True)
                return 1
            medians[name].append(tps.median)
    base = sum(medians["guard off"]) / len(medians["guard off"])
    for name, values in medians.items():
        mean = sum(values) / len(values)
        print(f"{name:>10}: mean of medians {mean:,.0f} tokens/s/device, "
              f"ratio to guard off {mean / base:.4f}  (runs: {[round(v) for v in values]})")
    return 0


def inject(args: argparse.Namespace, env: dict[str, str]) -> int:
    """NaN at step 7 (last rank), log_freq 10: must stop non-zero, named, found at step 10."""
    inj_env = dict(env, TITAN_ROCM_DEBUG_INJECT_NAN_STEP="7")
    if args.ngpu > 1:
        inj_env["TITAN_ROCM_DEBUG_INJECT_NAN_RANK"] = str(args.ngpu - 1)
    log, rc, secs = train("inject_nan_step7", [], args, inj_env)
    text = log.read_text(errors="replace")
    stop = [ln for ln in text.splitlines() if "ERROR - titan-rocm divergence guard" in ln]
    check = check_file(log)
    print(f"injection: rc={rc} in {secs:.0f}s; guard error lines: {len(stop)}; "
          f"check-log exit {check.exit_code}")
    for line in stop:
        print("  " + line[:400])
    ok = (rc != 0 and len(stop) == 1 and "diverged at step 7" in stop[0]
          and "log step 10" in stop[0] and check.exit_code == 1
          and "Training completed" not in text)
    print("injection:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
