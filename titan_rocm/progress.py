"""Progress of a long command (``tune run``, ``scan``): tqdm's bar on a terminal; elsewhere a bar
is ``\\r`` noise, so a plain line goes out every ``interval`` seconds and once at the end."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

INTERVAL_S = 30.0

_FORMAT = "{n_fmt}/{total_fmt} {unit}s [{elapsed}<{remaining}]"


class Progress:
    """``n`` of a fixed ``total`` things done, with an ETA; on stderr, so stdout stays the
    result."""

    def __init__(self, total: int, unit: str, prefix: str, stream: TextIO | None = None,
                 tty: bool | None = None, interval: float = INTERVAL_S) -> None:
        self.total, self.unit, self.prefix = total, unit, prefix
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.interval = interval
        self.n = 0
        self.detail = ""
        self._start = time.monotonic()
        self._last_line = self._start
        self.lines = 0
        self._bar: Any = None
        if self.tty:
            self._bar = tqdm(total=total, unit=unit, desc=prefix, file=self.stream,
                             dynamic_ncols=True, leave=True)

    def update(self, n: int = 1, detail: str | None = None) -> None:
        """``n`` more things done; ``detail`` (e.g. counts by status) is shown beside."""
        self.n += n
        if detail is not None:
            self.detail = detail
        if self._bar is not None:
            if detail is not None:
                self._bar.set_postfix_str(detail, refresh=False)
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last_line >= self.interval:
            self._last_line = now
            self._line(now)

    def line(self) -> str:
        return self._text(time.monotonic())

    def _text(self, now: float) -> str:
        meter = tqdm.format_meter(self.n, self.total, now - self._start, unit=self.unit,
                                  bar_format=_FORMAT)
        return f"{self.prefix}: {meter}" + (f" ({self.detail})" if self.detail else "")

    def _line(self, now: float) -> None:
        print(self._text(now), file=self.stream, flush=True)
        self.lines += 1

    def close(self) -> None:
        """End the bar, or write a last line so a log shows where it ended."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.lines:
            self._line(time.monotonic())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False
