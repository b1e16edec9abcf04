"""``rocm.numerics_audit``: the block-by-block numerics audit inside training."""
