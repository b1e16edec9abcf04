"""``rocm.moe_eager_compile``: dense TransformerBlocks compiled whole, MoE blocks eager.

Docs: docs/moe-eager-compile.md.
"""
