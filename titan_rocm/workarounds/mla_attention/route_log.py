"""Log each backward route once per (caller, arch, shape, flags) at run time."""

from __future__ import annotations

import logging

from titan_rocm import log as titan_log
from titan_rocm.workarounds.mla_attention.routing import BackwardCall, Route, arch_label

KEY_PREFIX = "mla_route:"


def log_route_once(caller: str, call: BackwardCall, route: Route) -> bool:
    """Log ``route`` for ``call`` the first time this caller sees it; True if it logged."""
    return titan_log.log_once(
        f"{KEY_PREFIX}{caller}:{call!r}",
        logging.INFO,
        "titan-rocm: mla_ck_backward [%s] %s q/k %d, v %d, %s%s%s%s: backward -> %s (%s)",
        caller,
        arch_label(call.arch),
        call.hdim_q,
        call.hdim_v,
        call.dtype,
        f", dropout {call.dropout_p}" if call.dropout_p else "",
        ", bias/alibi" if call.has_bias or call.has_alibi else "",
        ", deterministic" if call.deterministic else "",
        route.label,
        route.reason,
    )


def forget() -> None:
    """Forget what was logged (tests)."""
    titan_log.forget(KEY_PREFIX)
