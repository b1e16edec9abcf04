"""titan-rocm's one logger, and the one log-once helper.

Every module logs through :data:`log` with ``%``-style arguments. The logger is a child of
the root logger, which is where TorchTitan (0.2.2 and 0.3.0) installs its handler, so
titan-rocm's lines appear in the training log in TorchTitan's format; nothing here imports
TorchTitan.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("titan_rocm")

_seen: set[str] = set()
_lock = threading.Lock()


def log_once(key: str, level: int, msg: str, *args: object) -> bool:
    """Log ``msg % args`` at ``level`` the first time ``key`` is seen in this process.

    Returns:
        True if the message was logged now, False if ``key`` was logged before.
    """
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
