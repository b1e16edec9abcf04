"""Numerics audit: compiled gradients against eager references, per parameter (docs/numerics-audit.md)."""
