"""titan-rocm's varlen MLA (per-document attention) inside TorchTitan 0.2.2's real trainer, on
one NVIDIA GPU, against stock FlexAttention with the same document masks.

One command, from the repository root (torch, triton and TorchTitan 0.2.2 installed):

    python benchmarks/mla_varlen_packing.py --out benchmarks/results/<dir>
    python benchmarks/mla_varlen_packing.py --reanalyse benchmarks/results/<dir>   # any machine

Four runs of the ``bench_mla_varlen`` flavor (benchmarks/bench_flavors.py: DeepSeek-V3 16B's
attention, block_causal masks, two blocks), the shipped tokenizer and dataset (short documents,
each ending in EOS, packed into 2048-token samples), same seed and data, compile on, selective
op checkpointing, one after the other on GPU 0 with one shared Inductor cache:

- ``stock_a``, ``stock_b``: TorchTitan's FlexAttention under its block_causal BlockMask, twice:
  what identical jobs differ by;
- ``varlen``: ``rocm.mla_ck_backward`` under a simulated MI300X with aiter main
  (benchmarks/mla_varlen_runner.py): DocumentSpans from TorchTitan's document boundaries,
  titan-rocm's varlen custom ops and routing, the fake aiter's varlen kernels computed by
  PyTorch's flash varlen attention;
- ``dropped``: the same with ``mla_document_masks = "drop"`` (causal across documents): the
  negative control, which must differ from stock visibly more than ``varlen`` does.

Figures: per-step loss differences against ``stock_a``; the verdict is ``pass`` when every run
finished, ``varlen`` stays within ``max(3 x stock noise, --tolerance)`` at every step and the
control differs more than 3 x ``varlen``; ``fail`` when ``varlen`` leaves that band;
``inconclusive`` otherwise. Written to ``--out``: ``summary.json`` (figures, environment, runs)
and ``logs.tar.gz``.

What it proves: inside the real trainer (data loader, EOS document boundaries, FSDP-free single
GPU, torch.compile of the blocks, op-level SAC), titan-rocm packs (batch, heads, seqlen, dim)
into varlen tokens and back, builds cu_seqlens that are TorchTitan's document boundaries, and
trains as stock per-document attention does. What it does not prove: anything about aiter's
kernels (the fake's are PyTorch flash), about ROCm or an MI300X, or the routing's kernel tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.gpu_validation import Run, analyse, launch, stored_runs  # noqa: E402

CONFIG = "configs/deepseek_v3_debug.toml"
RUNS = ("stock_a", "stock_b", "varlen", "dropped")
TIMEOUTS = {"stock_a": 170, "stock_b": 110, "varlen": 170, "dropped": 130}
"""Seconds per run: under ten minutes in all, the device tool's limit per command."""
DEFAULT_TOLERANCE = 0.02
"""Loss difference allowed beyond the stock noise: bf16 flash vs flex rounding over the run."""
CALLS_PREFIX = "TITAN_ROCM_MLA_CALLS "


def runs(steps: int) -> list[Run]:
    """The four runs, in launch order."""
    common = ["--model.flavor", "bench_mla_varlen", "--training.steps", str(steps),
              "--training.local_batch_size", "4", "--debug.seed", "42",
              "--metrics.log_freq", "1", "--compile.enable"]
    stock = [*common, "--stock", "--experimental.custom_import", "benchmarks.bench_flavors"]
    ours = [*common, "--experimental.custom_import", "benchmarks.bench_flavors_rocm",
            "--model.converters", "rocm.mla_ck_backward", "--rocm.mla_ck_backward", "on"]
    return [
        Run("stock_a", CONFIG, stock, shared_cache=True, timeout=TIMEOUTS["stock_a"]),
        Run("varlen", CONFIG, ours, shared_cache=True, timeout=TIMEOUTS["varlen"],
            runner="mla_varlen_runner.py"),
        Run("stock_b", CONFIG, stock, shared_cache=True, timeout=TIMEOUTS["stock_b"]),
        Run("dropped", CONFIG, [*ours, "--rocm.mla_document_masks", "drop"], shared_cache=True,
            timeout=TIMEOUTS["dropped"], runner="mla_varlen_runner.py"),
    ]


def _max_diff(a: dict[int, float], b: dict[int, float]) -> float | None:
    steps = sorted(set(a) & set(b))
    return max(abs(a[s] - b[s]) for s in steps) if steps else None


def _first_diff(a: dict[int, float], b: dict[int, float]) -> float | None:
    steps = sorted(set(a) & set(b))
    return abs(a[steps[0]] - b[steps[0]]) if steps else None


def _kernel_calls(log_text: str) -> dict[str, int] | None:
    lines = [x for x in log_text.splitlines() if CALLS_PREFIX in x]
    return json.loads(lines[-1].split(CALLS_PREFIX, 1)[1]) if lines else None


def figures_of(results: dict[str, dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """Loss differences against ``stock_a``, the routes seen, and the verdict."""
    loss = {name: {int(s): v for s, v in r.get("loss", {}).items()}
            for name, r in results.items()}
    base = loss.get("stock_a", {})
    diffs = {name: {"max_abs_loss_diff": _max_diff(curve, base),
                    "first_step_loss_diff": _first_diff(curve, base),
                    "steps": len(curve)}
             for name, curve in loss.items() if name != "stock_a"}
    noise = diffs.get("stock_b", {}).get("max_abs_loss_diff")
    ours = diffs.get("varlen", {}).get("max_abs_loss_diff")
    control = diffs.get("dropped", {}).get("max_abs_loss_diff")
    band = max(3 * noise, tolerance) if noise is not None else None
    finished = all(results.get(n, {}).get("exit") == 0 for n in RUNS) and len(
        {len(loss.get(n, {})) for n in RUNS}) == 1 and base
    if not finished or ours is None or band is None:
        verdict = "inconclusive"
    elif ours > band:
        verdict = "fail"
    elif control is not None and control > 3 * ours:
        verdict = "pass"
    else:
        verdict = "inconclusive"
    return {
        "verdict": verdict,
        "tolerance": tolerance,
        "band": band,
        "diffs_vs_stock_a": diffs,
        "exits": {n: results.get(n, {}).get("exit") for n in RUNS},
        "routes": {n: results[n].get("mla_routes") for n in ("varlen", "dropped")
                   if n in results},
        "kernel_calls": {n: results[n].get("kernel_calls") for n in ("varlen", "dropped")
                         if n in results},
    }


def analyse_run(raw: dict[str, Any]) -> dict[str, Any]:
    """``gpu_validation.analyse`` plus the MLA route lines and fake-kernel counts."""
    result = analyse(raw)
    text = Path(raw["log"]).read_text(errors="replace")
    result["mla_routes"] = sorted({x.split("mla_ck_backward [op] ", 1)[1].split("; why: ", 1)[0]
                                   for x in text.splitlines() if "mla_ck_backward [op] " in x})
    result["kernel_calls"] = _kernel_calls(text)
    return result


def write_results(out: Path, logs: Path, environment: dict[str, Any],
                  results: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """summary.json and logs.tar.gz, rewritten after every run (a timeout keeps the rest)."""
    figures = figures_of(results, tolerance)
    summary = {"environment": environment, "figures": figures,
               "runs": {n: {k: r[k] for k in ("name", "exit", "wall_s", "expect_failure",
                                              "triton_war_stats", "loss")}
                        for n, r in results.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        tar.add(logs, arcname="logs")
    return figures


def reanalyse(directory: Path, tolerance: float | None = None) -> dict[str, Any]:
    """Recompute every figure from a stored result (summary.json + logs.tar.gz), on any machine."""
    stored, raws = stored_runs(directory)
    results = {name: analyse_run(raw) for name, raw in raws.items()}
    chosen = stored["figures"]["tolerance"] if tolerance is None else tolerance
    return {"environment": stored["environment"], "figures": figures_of(results, chosen)}


def main() -> int:
    """Run the four jobs (or re-analyse a stored result) and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="result directory (created)")
    parser.add_argument("--reanalyse", type=Path, metavar="DIR",
                        help="recompute the figures of a stored result directory (no GPU)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tolerance", type=float, default=None,
                        help=f"loss band beyond 3 x stock noise (default {DEFAULT_TOLERANCE})")
    args = parser.parse_args()
    if args.reanalyse:
        print(json.dumps(reanalyse(args.reanalyse, args.tolerance), indent=2, default=str))
        return 0
    if not args.out:
        parser.error("--out is required (or --reanalyse DIR)")
    if args.steps < 2:
        parser.error(f"--steps {args.steps} is too few; accepted: 2 or more")
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="titan-rocm-logs-"))
    import torch

    environment = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__, "triton": __import__("triton").__version__,
        "command": " ".join(sys.argv),
    }
    results: dict[str, Any] = {}
    for run in runs(args.steps):
        raw = launch(run, logs, [0])
        results[run.name] = analyse_run(raw)
        figures = write_results(args.out, logs, environment, results, tolerance)
        print(f"[{run.name}] exit={raw['exit']} wall={raw['wall_s']}s", flush=True)
    print(json.dumps(figures, indent=2, default=str))
    return 0 if figures["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
