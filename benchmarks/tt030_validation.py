"""Validate titan-rocm's TorchTitan 0.3.0 adapter in 0.3.0's real trainer on one GPU.

One command on a GPU box (repository root; TorchTitan 0.3.0 and titan-rocm importable)::

    python -m benchmarks.tt030_validation --out benchmarks/results/<dir>
    python -m benchmarks.tt030_validation --reanalyse benchmarks/results/<dir>   # any machine

1. **Probe** (a subprocess): which TorchTitan and torch, and which torch APIs TorchTitan 0.3.0
   uses that this torch lacks: every ``from torch... import x`` and every ``torch.a.b`` chain in
   the installed ``torchtitan`` package, resolved against this torch (a name reported missing
   is missing; one that resolves may still behave differently). Then whether the trainer's
   import closure loads. 0.3.0 wants torch >= 2.14; ``torch.distributed.set_timeout`` (used by
   ``set_pg_timeouts`` after step 1) is shimmed from torch's own private
   ``distributed_c10d._set_pg_timeout`` when missing, and nothing else: the shim is named in
   the results. Any other missing API is reported, not shimmed.
2. If the trainer loads: the 0.2.2 validation set again on 0.3.0, stock vs ``rocm`` (workarounds
   forced ``on`` where ``auto`` skips on CUDA), same seed and data (``titan_rocm/assets``):
   llama3 and deepseek_v3 debug models (losses, eager MoE forwards, grouped-MM calls), the
   ``loop`` backend, stock MoE compile, the NaN injection stop at step 7 with log steps every
   10, then GPU-bound flavors (``benchmarks/tt030_configs.py``) stock vs ``rocm`` in mirrored
   order (A B B A) for throughput ratios. The debug runs go two at a time on the one GPU
   (host-bound models; their losses, counts and stops do not depend on it, their times to
   step 1 are noisier); the throughput runs one at a time. Runs share one Inductor cache
   (compile times are warm after a model's first run; the 0.2.2 suite's cold-cache figures
   are not redone). A time budget (``--budget-s``) skips what would not finish, and says so.

Writes ``summary.json`` and ``logs.tar.gz`` to ``--out`` after every run; ``--reanalyse``
recomputes every figure from them (``benchmarks/harness.py``'s log analysis).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import ROCM_ON, Run, max_rel_diff, ratio, report_value

COMMON = [
    "--dataloader.dataset_path", "./titan_rocm/assets/dataset",
    "--hf_assets_path", "./titan_rocm/assets/tokenizer",
    "--metrics.disable_color_printing", "--debug.seed", "42", "--compile.enable",
]
ROCM = "titan_rocm.torchtitan.configs"
CONFIGS = "benchmarks.tt030_configs"
"""The GPU-bound configs' module (TorchTitan 0.3.0's ``--module`` takes a dotted path)."""
INJECT_ENV = "TITAN_ROCM_DEBUG_INJECT_NAN_STEP"
SHIM_ENV = "TITAN_ROCM_SHIMS"
"""Shims the runner applies (comma-separated); only ``set_timeout`` exists."""
SHIMS = {SHIM_ENV: "set_timeout"}


def runs(steps: int, throughput_steps: int) -> tuple[list[Run], list[Run]]:
    """The validation set: debug-model runs (two at a time: host-bound, correctness figures),
    then the throughput runs (one at a time, mirrored)."""
    s = ["--training.steps", str(steps), "--metrics.log_freq", "10"]

    def debug(name: str, model: str, rocm: bool, *flags: str, env: dict[str, str] | None = None,
              **kw: Any) -> Run:
        return Run(name, f"{model}_debugmodel", [*COMMON, *s, *flags], module=ROCM if rocm
                   else model, env={**SHIMS, **(env or {})}, timeout=240, shared_cache=True,
                   **kw)

    t = ["--training.steps", str(throughput_steps), "--metrics.log_freq", "5"]
    mirrored = []
    for model in ("deepseek_v3_4b", "llama3_1b"):
        for tag, cfg in (("a", model), ("b", f"{model}_rocm"), ("c", f"{model}_rocm"),
                         ("d", model)):
            variant = "rocm" if cfg.endswith("_rocm") else "stock"
            flags = [*COMMON, *t, *(ROCM_ON if variant == "rocm" else [])]
            mirrored.append(Run(f"{model}_{variant}@{tag}", cfg, flags, module=CONFIGS,
                                env=dict(SHIMS), timeout=300, shared_cache=True))
    return [
        debug("llama3_stock", "llama3", False),
        debug("llama3_rocm", "llama3", True, *ROCM_ON),
        debug("llama3_nan_step7", "llama3", True, *ROCM_ON, env={INJECT_ENV: "7"},
              expect_failure=True),
        debug("deepseek_v3_stock", "deepseek_v3", False),
        debug("deepseek_v3_rocm", "deepseek_v3", True, *ROCM_ON),
        debug("deepseek_v3_rocm_loop", "deepseek_v3", True, *ROCM_ON,
              "--rocm.grouped_mm_backend", "loop"),
        debug("deepseek_v3_rocm_stock_moe_compile", "deepseek_v3", True, *ROCM_ON,
              "--rocm.moe_eager_compile", "off"),
    ], mirrored


# -- the probe (runs in a subprocess: this process never imports TorchTitan) -------------------

def _torch_names(tree: ast.AST) -> set[str]:
    """``torch.a.b`` names a module uses: ``from torch.a import b`` and attribute chains."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module == "torch" or node.module.startswith("torch.")):
            names.update(f"{node.module}.{a.name}" for a in node.names if a.name != "*")
        elif isinstance(node, ast.Attribute):
            parts, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id == "torch":
                names.add(".".join(["torch", *reversed(parts)]))
    return names


def resolves(name: str) -> bool:
    """``name`` (``torch.a.b.c``) is a module or an attribute reachable from one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


SKIP_PREFIXES = ("torch.ops.", "torch._C.", "torch.classes.")
"""Resolved at run time (custom ops, bindings), not by attribute lookup here."""


def missing_torch_apis(package_dir: Path, only: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Per torch name that does not resolve on this torch: the package files that use it.

    Args:
        package_dir: the installed ``torchtitan`` directory.
        only: relative paths (prefixes) to read; empty: every ``.py`` except experiments.
    """
    where: dict[str, set[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        if rel.startswith("experiments/") or (only and not rel.startswith(only)):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for name in _torch_names(tree):
            where.setdefault(name, set()).add(rel)
    missing = {}
    for name in sorted(where):
        if name.startswith(SKIP_PREFIXES) or resolves(name):
            continue
        # A chain under a missing name is reported once, at the shortest missing name.
        if any(name.startswith(m + ".") for m in missing):
            continue
        missing[name] = sorted(where[name])
    return missing


TRAINER_PATHS = ("train.py", "trainer.py", "components/", "config/", "distributed/",
                 "models/common/", "models/llama3/", "models/deepseek_v3/", "protocols/",
                 "tools/", "hf_datasets/text_datasets.py", "observability/")
"""The files the llama3/deepseek_v3 trainer runs (the probe's first table)."""


def probe() -> dict[str, Any]:
    """What this machine's torch offers TorchTitan 0.3.0 (run in a fresh interpreter)."""
    import importlib.metadata
    import importlib.util

    import torch

    result: dict[str, Any] = {"torch": torch.__version__}
    try:
        result["torchtitan"] = importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        result["torchtitan"] = None
        return result
    spec = importlib.util.find_spec("torchtitan")
    package = Path(spec.origin).parent  # type: ignore[union-attr, arg-type]
    result["missing_in_trainer_files"] = missing_torch_apis(package, TRAINER_PATHS)
    result["missing_elsewhere"] = {
        k: v for k, v in missing_torch_apis(package).items()
        if k not in result["missing_in_trainer_files"]
    }
    from benchmarks.torchtitan_runner import apply_shims

    result["shims"] = apply_shims()
    errors = {}
    for module in ("torchtitan.train", "torchtitan.models.llama3.config_registry",
                   "torchtitan.models.deepseek_v3.config_registry",
                   ROCM, CONFIGS):
        try:
            importlib.import_module(module)
        except Exception as exc:  # the probe reports, it never stops
            errors[module] = f"{type(exc).__name__}: {exc}"
    result["import_errors"] = errors
    result["trainer_imports"] = not errors
    return result


# -- figures -----------------------------------------------------------------------------------

def _loss_rel(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    return max_rel_diff(a.get("loss") or {}, b.get("loss") or {}, 5)


def _tps_median(runs: list[dict[str, Any]]) -> float | None:
    import statistics

    pooled = [t for r in runs for t in (r.get("tps_intervals_all") or [])]
    return round(statistics.median(pooled), 1) if pooled else None


def figures(results: dict[str, dict[str, Any]], probe_result: dict[str, Any] | None
            ) -> dict[str, Any]:
    """Every figure the runs support."""
    out: dict[str, Any] = {}
    if probe_result is not None:
        out["probe"] = {k: probe_result.get(k) for k in (
            "torch", "torchtitan", "trainer_imports", "shims", "import_errors")}
        out["probe"]["missing_torch_apis_in_trainer_files"] = sorted(
            probe_result.get("missing_in_trainer_files") or {})
    r = {name: run for name, run in results.items() if "log" in run}  # not the skipped
    for model in ("llama3", "deepseek_v3"):
        stock, rocm = r.get(f"{model}_stock"), r.get(f"{model}_rocm")
        if stock and rocm:
            out[model] = {
                "exit": (stock["exit"], rocm["exit"]),
                "loss_max_rel_diff": _loss_rel(rocm, stock),
                "loss_step1": ((stock.get("loss") or {}).get(1), (rocm.get("loss") or {}).get(1)),
                "to_step1_s": (stock["to_step1_s"], rocm["to_step1_s"]),
                "eager_moe_forwards": report_value(rocm, "eager_moe_forwards"),
                "grouped_mm_calls": report_value(rocm, "grouped_mm_calls"),
                "titan_rocm_lines": rocm.get("titan_rocm_lines"),
            }
    if "deepseek_v3_rocm" in r and "deepseek_v3_rocm_loop" in r:
        a, b = r["deepseek_v3_rocm"], r["deepseek_v3_rocm_loop"]
        out["grouped_mm_loop_vs_torch"] = {"loss_max_rel_diff": _loss_rel(b, a),
                                           "grouped_mm_calls": report_value(b, "grouped_mm_calls")}
    if "deepseek_v3_rocm_stock_moe_compile" in r:
        run = r["deepseek_v3_rocm_stock_moe_compile"]
        out["stock_moe_compile"] = {"exit": run["exit"],
                                    "eager_moe_forwards": report_value(run, "eager_moe_forwards")}
    if "llama3_nan_step7" in r:
        nan = r["llama3_nan_step7"]
        out["nan_injection"] = {"exit": nan["exit"], "stopped_as": nan.get("guard_lines"),
                                "last_step_logged": max(nan.get("steps_logged") or [0])}
    for model in ("deepseek_v3_4b", "llama3_1b"):
        passes = {v: [run for name, run in r.items() if name.startswith(f"{model}_{v}@")]
                  for v in ("stock", "rocm")}
        if passes["stock"] and passes["rocm"]:
            out[f"{model}_throughput"] = {
                "tps_ratio_rocm_over_stock": ratio(_tps_median(passes["rocm"]),
                                                    _tps_median(passes["stock"])),
                "per_pass": [ratio(b.get("tps_median"), a.get("tps_median"))
                             for a, b in zip(passes["stock"], passes["rocm"], strict=False)],
                "loss_max_rel_diff": _loss_rel(passes["rocm"][0], passes["stock"][0]),
                "exits": {v: [run["exit"] for run in runs] for v, runs in passes.items()},
            }
    return out


def analyse_run(raw: dict[str, Any]) -> dict[str, Any]:
    """:func:`harness.analyse`, with every logged interval kept (throughput runs log every 5
    steps: intervals after step 5 count)."""
    from titan_rocm.logs.parse import parse_file

    result = harness.analyse(raw)
    train = [t for t in parse_file(Path(raw["log"])).train_records if t.rank in (None, 0)]
    result["tps_intervals_all"] = [t.tps for t in train if t.step > 5 and t.tps]
    return result


def summary(environment: dict[str, Any], probe_result: Any, results: dict[str, Any]
            ) -> dict[str, Any]:
    """What a call stores: environment, the probe, every figure, every run."""
    return {"environment": environment, "probe": probe_result,
            "figures": figures(results, probe_result), "runs": results}


def reanalyse(directory: Path) -> dict[str, Any]:
    """Recompute every figure from a stored result, on any machine."""
    with harness.stored_runs(directory) as (stored, raws):
        results = {name: analyse_run(raws[name]) if name in raws else run  # skipped: as stored
                   for name, run in stored["runs"].items()}
    return {"environment": stored["environment"],
            "figures": figures(results, stored.get("probe"))}


def run_probe(logs: Path) -> dict[str, Any]:
    """The probe in a fresh interpreter (this one never imports TorchTitan); its log in
    ``logs``."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.tt030_validation", "--probe-only"],
                         cwd=harness.REPO, env=harness.child_env(), capture_output=True,
                         text=True, timeout=300)
    (logs / "probe.log").write_text(out.stdout + out.stderr)
    line = next((x for x in out.stdout.splitlines() if x.startswith("TT030_PROBE ")), None)
    return json.loads(line.split(" ", 1)[1]) if line else {"error": out.stderr[-2000:]}


def main(argv: list[str] | None = None) -> int:
    """Probe, run what this machine can run, write and print the figures."""
    parser = harness.parser(__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--throughput-steps", type=int, default=30)
    harness.add_budget(parser, 500.0, "skip runs that would start after this many seconds")
    parser.add_argument("--probe-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_only:  # the subprocess
        print("TT030_PROBE " + json.dumps(probe(), default=str), flush=True)
        return 0
    if args.reanalyse:
        return harness.print_reanalysis(parser, reanalyse, args.reanalyse)
    debug, mirrored = runs(args.steps, args.throughput_steps)
    if args.list:
        print("\n".join(run.describe() for run in [*debug, *mirrored]))
        return 0
    out = harness.require_out(parser, args)
    probe_result: dict[str, Any] = {}
    call = harness.Call(out, lambda c: summary(c.environment, probe_result, c.results),
                        budget_s=args.budget_s,
                        compile_cache="shared by every run (warm after a model's first run)")
    probe_result.update(run_probe(call.logs))
    call.store()
    print(json.dumps({"probe": probe_result}, indent=2, default=str), flush=True)
    if not probe_result.get("trainer_imports"):
        print("TorchTitan 0.3.0's trainer does not load on this machine: see the probe; "
              "no training run was made", flush=True)
        return 1
    # Two debug runs at a time on the one GPU (host-bound), the throughput runs one at a time;
    # a run expected to take ~60 s is not started when it would end past the budget.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda run: call.run(run, analyse_run), debug))
    for run in mirrored:
        call.run(run, analyse_run)
    figs = call.store()["figures"]
    print(json.dumps({"environment": call.environment, "figures": figs}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
