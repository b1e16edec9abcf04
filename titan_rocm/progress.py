"""Progress of a command that can run past a few seconds (``tune run``, ``scan`` of a large
cache): a fixed total from the start and an estimate of the time left.

On a terminal it is tqdm's bar (redrawn in place). Anywhere else (a log file, a pipe, CI)
a bar would write ``\\r`` noise or nothing, so a plain line goes out every ``interval``
seconds and once at the end, in the same words tqdm's bar uses (``tqdm.format_meter``).
tqdm is the one progress library of the project: pure Python, no dependencies.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

INTERVAL_S = 30.0
"""Seconds between two progress lines when the stream is not a terminal."""

_FORMAT = "{n_fmt}/{total_fmt} {unit}s [{elapsed}<{remaining}]"


class Progress:
    """``n`` of a fixed ``total`` things done, with an ETA; use as a context manager.

    Args:
        total: how many things there are (fixed: known before the first is done).
        unit: what one thing is called (``problem``, ``file``).
        prefix: the command, printed first (``titan-rocm tune``).
        stream: where to write (default ``sys.stderr``, so stdout stays the command's result).
        tty: draw a bar (default: whether ``stream`` is a terminal).
        interval: seconds between lines when not drawing a bar.
    """

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
        """Progress lines written (not on a terminal)."""
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
        """The progress as one line (what goes out when not on a terminal)."""
        return self._text(time.monotonic())

    def _text(self, now: float) -> str:
        meter = tqdm.format_meter(self.n, self.total, now - self._start, unit=self.unit,
                                  bar_format=_FORMAT)
        return f"{self.prefix}: {meter}" + (f" ({self.detail})" if self.detail else "")

    def _line(self, now: float) -> None:
        print(self._text(now), file=self.stream, flush=True)
        self.lines += 1

    def close(self) -> None:
        """End the bar, or write the last line when earlier ones went out (so a log shows
        where it ended)."""
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
