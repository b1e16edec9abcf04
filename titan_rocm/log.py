"""titan-rocm's one logger, and the one log-once helper."""
from __future__ import annotations
import logging
import threading
log = logging.getLogger("titan_rocm")
_seen: set[str] = set()
_lock = threading.Lock()
def log_once(key: str, level: int, msg: str, *args: object) -> bool:
    """Log ``msg % args`` at ``level`` the first time ``key`` is seen in this process; True if logged."""
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    log.log(level, msg, *args)
    return True
