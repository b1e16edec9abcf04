"""Benchmark-only TorchTitan 0.2.2 model flavors: GPU-bound sizes that fit one GPU.

The debug flavors are host-bound on an H200 (a step is mostly Python and kernel launches),
so their tokens/s swing by +-25% between 10-step intervals and cannot resolve a 1% cost.
These flavors make the GPU the bottleneck. Loaded with TorchTitan's own hook:

    --experimental.custom_import benchmarks.bench_flavors        # stock runs
    --experimental.custom_import benchmarks.bench_flavors_rocm   # runs with titan-rocm

Only ``llama3`` needs one (0.2.2 has nothing between the 6-layer debug model and 8B, which
does not train on one GPU); ``qwen3`` has its own 0.6B/1.7B flavors.
"""

from __future__ import annotations

from torchtitan.models.llama3 import llama3_args
from torchtitan.models.llama3.model.args import TransformerModelArgs

# Llama 3.2 1B's shape (16 layers, dim 2048, GQA 32/8), with Llama 3's 128256-entry vocab.
llama3_args.setdefault("bench_1B", TransformerModelArgs(
    dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5,
    multiple_of=256, rope_theta=500000,
))
