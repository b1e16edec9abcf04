"""Log each route once per (caller, direction, call) at run time."""

from __future__ import annotations

import logging

from titan_rocm import log as titan_log
from titan_rocm.workarounds.mla_ck_backward.routing import AttentionCall, Route, arch_label

KEY_PREFIX = "mla_route:"


def log_route_once(caller: str, direction: str, call: AttentionCall, route: Route) -> bool:
    """Log ``route`` for ``call`` the first time this caller sees it; True if it logged."""
    return titan_log.log_once(
        f"{KEY_PREFIX}{caller}:{direction}:{call!r}",
        logging.INFO,
        "titan-rocm: mla_ck_backward [%s] %s %s, %s%s%s%s%s: %s -> %s, runs %s; why: %s",
        caller,
        arch_label(call.arch),
        call.shape,
        call.dtype,
        ", varlen" if call.varlen else "",
        f", dropout {call.dropout_p}" if call.dropout_p else "",
        ", bias/alibi" if call.has_bias or call.has_alibi else "",
        ", deterministic" if call.deterministic else "",
        direction,
        route.label,
        route.kernel,
        route.reason,
    )


def forget() -> None:
    """Forget what was logged (tests)."""
    titan_log.forget(KEY_PREFIX)
