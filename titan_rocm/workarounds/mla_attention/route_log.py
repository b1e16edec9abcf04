"""Log each route once per (caller, direction, call) at run time."""

from __future__ import annotations

import threading

from titan_rocm.log import log
from titan_rocm.workarounds.mla_attention.routing import AttentionCall, Route, arch_label

_lock = threading.Lock()
_logged: set[tuple[str, str, AttentionCall]] = set()


def log_route_once(caller: str, direction: str, call: AttentionCall, route: Route) -> bool:
    """Log ``route`` for ``call`` the first time this caller sees it; True if it logged."""
    key = (caller, direction, call)
    with _lock:
        if key in _logged:
            return False
        _logged.add(key)
    log.info(
        "titan-rocm: mla_ck_backward [%s] %s %s, %s%s%s%s%s: %s -> %s, runs %s (%s)",
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
    return True


def forget() -> None:
    """Forget what was logged (tests)."""
    with _lock:
        _logged.clear()
