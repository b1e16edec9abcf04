"""titan-rocm's one logger, and the one log-once helper.

A child of the root logger, where TorchTitan installs its handler, so titan-rocm's lines show
in TorchTitan's format without importing it."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("titan_rocm")

_seen: set[str] = set()
_lock = threading.Lock()


def log_once(key: str, level: int, msg: str, *args: object) -> bool:
    """Log ``msg % args`` the first time ``key`` is seen in this process; True if logged now."""
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    log.log(level, msg, *args)
    return True


def forget(prefix: str = "") -> None:
    """Let keys starting with ``prefix`` log again (tests; a new job in the same process)."""
    with _lock:
        for key in [k for k in _seen if k.startswith(prefix)]:
            _seen.discard(key)
