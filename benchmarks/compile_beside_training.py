"""Why the audit's probed copies do not compile on a thread beside training (no GPU needed).

A job's blocks are compiled (``fullgraph=True``, Inductor) and trained with AdamW (foreach)
on this thread while a second thread compiles another block the way the audit's probed copy
would be compiled beside training (its backward lowered with its forward). Before each block
call and each optimizer step, this thread reads the process-wide flags torch's compile sets:
``torch.compiler.is_compiling()`` (held for a whole compile by torch 2.13's
``convert_frame.compile_inner``), ``torch.fx._symbolic_trace._is_fx_tracing_flag`` (set while
AOTAutograd traces: a compiled call then raises "Detected that you are using FX to
symbolically trace a dynamo-optimized function" where ``is_compiling()`` is not also held,
as in torch 2.11). Each run prints how many of the job's reads saw either flag, the errors
either thread raised, and whether the job's parameters after the same steps are bit for bit
those of a run without the second thread (the optimizer branches on ``is_compiling()``;
``alone_twice_equal``: the job alone, twice, is).

    python -m benchmarks.compile_beside_training [--runs 3] [--steps 300] [--fullgraph] > F.jsonl
    python -m benchmarks.compile_beside_training --reanalyse DIR   # the figures of DIR/*.jsonl

``--fullgraph``: the second thread's compile is ``fullgraph=True`` too (torch 2.13 counts
fullgraph frames in one process-wide counter, ``torch/csrc/dynamo/eval_frame.h``
``fullgraph_compiled_frame_count``, which one thread's call resets under the other's).
Caches are off (``fx_graph_cache``, ``enable_autograd_cache``): every compile is a cold one.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn


class _Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.w1 = nn.Linear(dim, 4 * dim, bias=False)
        self.w2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.nn.functional.silu(self.w1(self.norm(x))))


def _job(seed: int, dim: int) -> tuple[list[_Block], torch.optim.Optimizer]:
    torch.manual_seed(seed)
    blocks = [_Block(dim) for _ in range(4)]
    for block in blocks:
        block.compile(fullgraph=True)
    params = [p for b in blocks for p in b.parameters()]
    return blocks, torch.optim.AdamW(params, lr=1e-3, foreach=True)


def _train(blocks: list[_Block], opt: torch.optim.Optimizer, x: torch.Tensor, steps: int,
           beside: threading.Thread | None) -> dict[str, Any]:
    seen = {"reads": 0, "is_compiling": 0, "fx_tracing": 0, "errors": [], "steps": 0}

    def read() -> None:
        seen["reads"] += 1
        seen["is_compiling"] += bool(torch.compiler.is_compiling())
        seen["fx_tracing"] += bool(torch.fx._symbolic_trace._is_fx_tracing_flag)

    for step in range(steps):
        if beside is not None and step == 1:
            beside.start()  # after the job's own first compile, as an audit would
        try:
            h = x
            for block in blocks:
                read()
                h = block(h)
            h.square().mean().backward()
            read()
            opt.step()
            opt.zero_grad()
        except Exception as exc:  # noqa: BLE001 - the figure is the error itself
            seen["errors"].append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            opt.zero_grad()
        seen["steps"] += 1
    return seen


def one_run(steps: int, fullgraph: bool, dim: int = 256) -> dict[str, Any]:
    """The job alone, then the same job with a compile beside it."""
    torch._dynamo.reset()
    x = torch.randn(8, 64, dim)
    alone_blocks, alone_opt = _job(0, dim)
    _train(alone_blocks, alone_opt, x, steps, None)
    torch._dynamo.reset()
    again_blocks, again_opt = _job(0, dim)  # the control: the job alone, twice
    _train(again_blocks, again_opt, x, steps, None)
    torch._dynamo.reset()
    blocks, opt = _job(0, dim)
    other = _Block(dim)  # another block: the probed copy's stand-in
    thread_errors: list[str] = []

    def compile_beside() -> None:
        try:
            probed = torch.compile(lambda m, t: m(t + torch.zeros_like(t)), fullgraph=fullgraph)
            with torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
                probed(other, torch.randn(8, 64, dim, requires_grad=True))
        except Exception as exc:  # noqa: BLE001
            thread_errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")

    beside = threading.Thread(target=compile_beside)
    seen = _train(blocks, opt, x, steps, beside)
    beside.join()
    def params(job: list[_Block]) -> list[torch.Tensor]:
        return [p for b in job for p in b.parameters()]

    def equal(a: list[_Block], b: list[_Block]) -> bool:
        return all(torch.equal(p, q) for p, q in zip(params(a), params(b), strict=True))

    return {**seen, "thread_errors": thread_errors,
            "params_as_without_it": equal(blocks, alone_blocks),
            "alone_twice_equal": equal(again_blocks, alone_blocks)}


def reanalyse(directory: Path) -> dict[str, Any]:
    """Per stored ``*.jsonl`` file: its runs, the reads that saw each flag, the runs whose
    parameters differ from the job alone, the errors either thread raised (each with its
    count) and how many the job's thread raised in each run."""
    files = sorted(directory.glob("*.jsonl")) if directory.is_dir() else []
    if not files:
        raise ValueError(f"--reanalyse {directory}: no *.jsonl of this benchmark there; "
                         "accepted: a directory of its stored output")
    out: dict[str, Any] = {}
    for path in files:
        runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out[path.name] = {
            "torch": sorted({r["torch"] for r in runs}), "runs": len(runs),
            "fullgraph": sorted({r["fullgraph"] for r in runs}),
            "reads_each": sorted({r["reads"] for r in runs}),
            "is_compiling_reads": [r["is_compiling"] for r in runs],
            "fx_tracing_reads": [r["fx_tracing"] for r in runs],
            "runs_params_differ": sum(not r["params_as_without_it"] for r in runs),
            "runs_alone_twice_equal": sum(r["alone_twice_equal"] for r in runs),
            # Each error once with how often it was raised: a stuck flag raises at every step.
            "job_errors": dict(Counter(e for r in runs for e in r["errors"])),
            "job_errors_each": [len(r["errors"]) for r in runs],
            "thread_errors": dict(Counter(e for r in runs for e in r["thread_errors"]))}
    return out


def main(argv: list[str] | None = None) -> int:
    """Run and print one JSON line per run, or reanalyse stored runs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--fullgraph", action="store_true")
    parser.add_argument("--reanalyse", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    if args.reanalyse:
        try:
            print(json.dumps(reanalyse(args.reanalyse), indent=2))
        except ValueError as exc:
            parser.error(str(exc))
        return 0
    for name, value in (("--runs", args.runs), ("--steps", args.steps)):
        if value < 2:
            parser.error(f"{name} {value} is not valid; accepted: an integer >= 2")
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        for run in range(args.runs):
            out = one_run(args.steps, args.fullgraph)
            print(json.dumps({"run": run, "torch": torch.__version__,
                              "fullgraph": args.fullgraph, **out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
