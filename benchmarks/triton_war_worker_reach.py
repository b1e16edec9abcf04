"""Does the triton_war wrapper see the kernels Inductor compiles in its worker pool? (GPU)

    python -m benchmarks.triton_war_worker_reach

Runs one small torch.compile'd function on the GPU twice, each in a fresh interpreter with
fresh Inductor/Triton caches and Inductor's subprocess compile pool:

* ``exported``: the converter's way: wrapper installed in the trainer AND the worker
  environment exported (``bootstrap.export``) before anything compiles;
* ``parent-only``: wrapper installed in the trainer only (the failure the bootstrap fixes).

Each prints which processes recorded compiles in the stats directory. On CUDA the wrapper
counts every kernel as ``skipped_non_hip`` (it scans only HIP targets); on ROCm they are
``scanned``. Either way a process file other than the trainer's means the worker had the
wrapper. Printed: ``RATIO worker compiles seen`` = compiles recorded by worker processes /
compiles recorded anywhere (``exported``: > 0; ``parent-only``: 0), and exit 0 when
``exported`` reached at least one worker and ``parent-only`` none.
"""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks import harness

CHILD = """
import json, os, sys
import torch
from titan_rocm.workarounds.triton_war import bootstrap, compile_hook
compile_hook.install(rule="precise")
if sys.argv[1] == "exported":
    bootstrap.export("precise", False, os.environ["TITAN_ROCM_TRITON_WAR_STATS_DIR"])
import torch._inductor.config as ic
ic.compile_threads = max(ic.compile_threads, 2)   # use the subprocess pool

@torch.compile
def f(x, y):
    return (torch.nn.functional.silu(x) * y).sum(0), (x * 2 + y).softmax(-1)

x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
f(x, x.clone())
torch.cuda.synchronize()
print(json.dumps({"pid": os.getpid()}))
"""


def run(mode: str) -> dict:
    """One fresh interpreter in ``mode``: the compiles each process recorded."""
    tmp = harness.fresh_dir(f"war-reach-{mode}")
    stats_dir = tmp / "stats"
    stats_dir.mkdir()
    env = harness.child_env(tmp, TITAN_ROCM_TRITON_WAR_STATS_DIR=str(stats_dir))
    for key in ("TITAN_ROCM_TRITON_WAR", "TORCHINDUCTOR_COMPILE_THREADS"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    trainer = json.loads(proc.stdout.strip().splitlines()[-1])["pid"]

    from titan_rocm.workarounds.triton_war import stats

    per_process = {}
    for path in sorted(stats_dir.glob("*.jsonl")):
        pid = int(path.stem.rsplit("-", 1)[1])
        per_process[pid] = stats.read_file(path).to_dict()
    worker = sum(s["compiled"] for pid, s in per_process.items() if pid != trainer)
    total = sum(s["compiled"] for s in per_process.values())
    return {"mode": mode, "trainer_pid": trainer, "per_process": per_process,
            "worker_compiles": worker, "all_compiles": total,
            "merged": stats.collect(stats_dir).to_dict()}


def main() -> int:
    """Both modes; 0 when only the exported one reached a worker."""
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA or ROCm GPU; none here", file=sys.stderr)
        return 2
    results = [run("exported"), run("parent-only")]
    for r in results:
        ratio = r["worker_compiles"] / r["all_compiles"] if r["all_compiles"] else 0.0
        print(f"{r['mode']:12s}: processes with stats {len(r['per_process'])}, compiles seen "
              f"{r['all_compiles']} (workers {r['worker_compiles']}); "
              f"RATIO worker compiles seen = {ratio:.3f}")
        print(json.dumps(r["merged"]))
    ok = results[0]["worker_compiles"] > 0 and results[1]["worker_compiles"] == 0
    print("RESULT:", "wrapper reaches the compile workers" if ok else "NOT as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
