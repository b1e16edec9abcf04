"""Numerics audit: each compiled block, forward and backward, against eager and
high-precision replays of its own inputs (docs/numerics-audit.md)."""
