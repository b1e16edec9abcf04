"""Training-log reading for ``titan-rocm check-log``, ``bench-summary`` and ``compare``.

Torch-free: CI machines without a GPU (or without torch) can check logs.

- :mod:`titan_rocm.logs.parse`: find TorchTitan and Megatron-LM metric lines in messy logs,
  and how the log ends (streamed: memory does not grow with the file).
- :mod:`titan_rocm.logs.record`: one metric line as the readers keep it.
- :mod:`titan_rocm.logs.verdict`: the one run verdict (ok, diverged, flagged, unreadable,
  incomplete, empty).
- :mod:`titan_rocm.logs.check`: is every logged loss and grad norm finite?
- :mod:`titan_rocm.logs.summary`: the throughput figures a benchmark pipeline may publish.
"""
