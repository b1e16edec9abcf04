"""Grouped-MM backends side by side: each backend's time over ``torch``'s, in one run.

Runs the MoE experts computation (SwiGLU, forward and backward) of every backend named on
the command line on the same inputs, interleaving the backends in each round so machine
noise hits them alike, and prints the median time per backend and its ratio to ``torch``.

    python -m benchmarks.grouped_mm_backends                      # CPU, BF16, loop vs torch
    python -m benchmarks.grouped_mm_backends --device cuda --backends torch loop primus_turbo
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from titan_rocm.workarounds.grouped_mm.backends import get_backend, primus_turbo_status


def _inputs(args: argparse.Namespace) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    e, d, h = args.experts, args.dim, args.hidden
    # Uneven routing, like a real router: counts drawn around tokens/experts.
    weights = torch.rand(e, generator=gen) + 0.5
    counts = (weights / weights.sum() * args.tokens).long()
    counts[-1] += args.tokens - counts.sum()
    tensors = [
        torch.randn(e, h, d, generator=gen) * d**-0.5,
        torch.randn(e, d, h, generator=gen) * h**-0.5,
        torch.randn(e, h, d, generator=gen) * d**-0.5,
        torch.randn(args.tokens, d, generator=gen),
    ]
    tensors = [t.to(device=args.device, dtype=dtype).requires_grad_() for t in tensors]
    return [*tensors, counts.to(args.device)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _step(fn, inputs: list[torch.Tensor], grad_out: torch.Tensor, backward: bool) -> None:
    for t in inputs[:4]:
        t.grad = None
    out = fn(*inputs)
    if backward:
        out.backward(grad_out)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 on success, 2 when a requested backend cannot run here."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["torch", "loop"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--forward-only", action="store_true")
    args = parser.parse_args(argv)

    if "primus_turbo" in args.backends and (missing := primus_turbo_status()):
        print(f"primus_turbo cannot run here: {missing}")
        return 2
    if "torch" not in args.backends:
        args.backends.insert(0, "torch")
    fns = {name: get_backend(name) for name in args.backends}
    inputs = _inputs(args)
    grad_out = torch.randn_like(inputs[3])
    backward = not args.forward_only

    for fn in fns.values():  # warm-up (allocator, kernel selection)
        _step(fn, inputs, grad_out, backward)
    _sync(args.device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            _step(fn, inputs, grad_out, backward)
            _sync(args.device)
            times[name].append(time.perf_counter() - start)

    what = "forward" if args.forward_only else "forward+backward"
    print(
        f"{what}, {args.device}, {args.dtype}: {args.experts} experts, {args.tokens} tokens, "
        f"dim {args.dim}, hidden {args.hidden}; median of {args.rounds} interleaved rounds"
    )
    base = statistics.median(times["torch"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:14s} {median * 1e3:9.3f} ms   ratio to torch {median / base:6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
