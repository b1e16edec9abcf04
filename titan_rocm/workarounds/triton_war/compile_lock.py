"""The process-wide lock around Triton compiles made through the compile wrapper."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class CompileLock:
    """Shared for ordinary compiles, exclusive for the buffer-ops flip (process-global state);
    writers first. Taking exclusive while holding shared raises RuntimeError, not a deadlock."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer: int | None = None
        self._writers_waiting = 0
        self._tls = threading.local()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock shared (many compiles at once; never during a flip)."""
        me = threading.get_ident()
        depth = getattr(self._tls, "depth", 0)
        if depth or self._writer == me:
            self._tls.depth = depth + 1
            try:
                yield
            finally:
                self._tls.depth = depth
            return
        with self._cond:
            while self._writer is not None or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        self._tls.depth = 1
        try:
            yield
        finally:
            self._tls.depth = 0
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock alone (no compile through the wrapper runs meanwhile)."""
        me = threading.get_ident()
        if self._writer == me:
            yield
            return
        if getattr(self._tls, "depth", 0):
            raise RuntimeError("buffer-ops flip requested from inside a compile (would deadlock)")
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer is not None or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = me
        try:
            yield
        finally:
            with self._cond:
                self._writer = None
                self._cond.notify_all()


COMPILE_LOCK = CompileLock()
