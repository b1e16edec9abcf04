"""``rocm.moe_eager_compile``: dense blocks compiled whole, MoE blocks eager
(docs/moe-eager-compile.md)."""
