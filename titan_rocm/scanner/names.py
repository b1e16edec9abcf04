"""The names the buffer-store workaround shares between processes: its environment variables and
hazard rules. A leaf, so the compile workers' bootstrap stays cheap."""

from __future__ import annotations

import typing

from titan_rocm.settings import HazardRule

RULE_NAMES: tuple[str, ...] = typing.get_args(HazardRule)
"""Hazard rules offered to users (``[rocm] triton_war_rule``, ``titan-rocm scan --rule``)."""

ENV_ENABLE = "TITAN_ROCM_TRITON_WAR"
"""``1``: install the compile wrapper in this interpreter when Triton is imported."""
ENV_RULE = "TITAN_ROCM_TRITON_WAR_RULE"
"""Default ``precise``."""
ENV_STRICT = "TITAN_ROCM_TRITON_WAR_STRICT"
"""``1``: raise in the compile when a hazardous kernel cannot be fixed."""
ENV_STATS_DIR = "TITAN_ROCM_TRITON_WAR_STATS_DIR"
"""Every process appends its per-compile stats here (``<host>-<pid>.jsonl``)."""
WORKER_ENV: tuple[str, ...] = (ENV_ENABLE, ENV_RULE, ENV_STRICT, ENV_STATS_DIR)

BUFFER_OPS_ENV = "AMDGCN_USE_BUFFER_OPS"
"""Triton's variable for the AMD buffer-ops knob (every version so far)."""
