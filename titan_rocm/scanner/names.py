"""The names the buffer-store workaround shares between processes: its environment
variables and the hazard rules a user may choose.

A leaf: imports nothing of titan-rocm but the settings, so the bootstrap that runs at the
start of every Inductor compile worker, the wrapper, the stats and the workaround all take
these from one place. ("triton_war": the hazard is a write-after-read, WAR, on the data
registers of a buffer store.)
"""

from __future__ import annotations

import typing

from titan_rocm.settings import HazardRule

RULE_NAMES: tuple[str, ...] = typing.get_args(HazardRule)
"""Hazard rules offered to users (``[rocm] triton_war_rule``, ``titan-rocm scan --rule``)."""

ENV_ENABLE = "TITAN_ROCM_TRITON_WAR"
"""``1``: install the compile wrapper in this interpreter when Triton is imported."""
ENV_RULE = "TITAN_ROCM_TRITON_WAR_RULE"
"""Hazard rule for workers: one of :data:`RULE_NAMES` (default ``precise``)."""
ENV_STRICT = "TITAN_ROCM_TRITON_WAR_STRICT"
"""``1``: raise in the compile when a hazardous kernel cannot be fixed."""
ENV_STATS_DIR = "TITAN_ROCM_TRITON_WAR_STATS_DIR"
"""Directory where every process appends its per-compile stats (``<host>-<pid>.jsonl``)."""
WORKER_ENV: tuple[str, ...] = (ENV_ENABLE, ENV_RULE, ENV_STRICT, ENV_STATS_DIR)
"""Every variable :func:`~.bootstrap.export` sets for child interpreters."""

BUFFER_OPS_ENV = "AMDGCN_USE_BUFFER_OPS"
"""Triton's environment variable for the AMD buffer-ops knob (every version so far)."""
