"""Training-log reading for ``titan-rocm check-log``, ``bench-summary`` and ``compare``; torch-free,
so CI machines without a GPU or torch can check logs."""
