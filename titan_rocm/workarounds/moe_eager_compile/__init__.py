"""``rocm.moe_eager_compile``: dense TransformerBlocks compiled whole, MoE blocks eager.

The workaround is in :mod:`.workaround`; the block facts it shares with others (which blocks
are MoE, the eager marker and counters) in :mod:`titan_rocm.workarounds.moe_blocks`.
Docs: docs/moe-eager-compile.md.
"""
