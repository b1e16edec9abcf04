"""Benchmark-only TorchTitan 0.2.2 model flavors: GPU-bound sizes that fit one GPU.

The debug flavors are host-bound on an H200 (a step is mostly Python and kernel launches),
so their tokens/s swing by +-25% between 10-step intervals and cannot resolve a 1% cost.
These flavors make the GPU the bottleneck. Loaded with TorchTitan's own hook:

    --experimental.custom_import benchmarks.bench_flavors        # stock runs
    --experimental.custom_import benchmarks.bench_flavors_rocm   # runs with titan-rocm

``llama3`` needs one (0.2.2 has nothing between the 6-layer debug model and 8B, which does
not train on one GPU), and so does ``deepseek_v3`` (its smallest real flavor, 16B, needs
several GPUs); ``qwen3`` has its own 0.6B/1.7B flavors.
"""

from __future__ import annotations

from typing import Any

from torchtitan.models.deepseek_v3 import deepseekv3_args
from torchtitan.models.deepseek_v3.model.args import DeepSeekV3ModelArgs
from torchtitan.models.llama3 import llama3_args
from torchtitan.models.llama3.model.args import TransformerModelArgs
from torchtitan.models.moe import MoEArgs

# Llama 3.2 1B's shape (16 layers, dim 2048, GQA 32/8), with Llama 3's 128256-entry vocab.
llama3_args.setdefault("bench_1B", TransformerModelArgs(
    dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5,
    multiple_of=256, rope_theta=500000,
))


def _deepseek_16b_mla(experts: int, top_k: int, **shape: Any) -> DeepSeekV3ModelArgs:
    """DeepSeek-V3 16B's attention and expert shapes (dim 2048, MLA: 16 heads, kv_lora_rank 512,
    q/k 128+64, v 128, mscale 0.70; 1408-wide experts, 2 shared, softmax routing) with
    ``experts`` routed experts (``top_k`` per token), the rest of the model from ``shape``."""
    return DeepSeekV3ModelArgs(
        dim=2048, moe_inter_dim=1408, n_dense_layers=1, n_heads=16,
        moe_args=MoEArgs(num_experts=experts, num_shared_experts=2, top_k=top_k,
                         score_func="softmax", route_norm=False, score_before_experts=False),
        q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, mscale=0.70, **shape)


# DeepSeek-V3 16B's shape (102400 vocab) cut to 12 layers and 32 experts (top 6): about 4 B
# parameters, 1 B active, so MoE compute dominates a step and it trains on one GPU. Plain
# causal SDPA attention (the 16B flavor's flex block_causal masks are a separate question: see
# docs/mla-ck-backward.md).
deepseekv3_args.setdefault("bench_moe_4B", _deepseek_16b_mla(
    32, 6, vocab_size=102400, inter_dim=10944, n_layers=12))

# DeepSeek-V3 16B's attention exactly (with flex attention and block_causal document masks)
# on a two-block model (one dense, one MoE block of 8 small experts) and the 2048-entry debug
# vocab, so the shipped tokenizer and dataset drive it and a run takes about a minute on one
# H200 (benchmarks/mla_varlen_packing.py).
deepseekv3_args.setdefault("bench_mla_varlen", _deepseek_16b_mla(
    8, 2, vocab_size=2048, inter_dim=5472, n_layers=2, attn_type="flex",
    attn_mask_type="block_causal"))
