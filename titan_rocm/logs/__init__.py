"""Training-log reading for ``titan-rocm check-log``, ``bench-summary`` and ``compare``.

Torch-free: CI machines without a GPU (or without torch) can check logs. :mod:`.parse` finds
the metric lines, :mod:`.verdict` gives the one run verdict, :mod:`.check` and :mod:`.summary`
are the commands.
"""
