"""Opening input files without blocking on ones that are not files (a FIFO, a device).

``open()`` on a FIFO waits for a writer forever, so a tool given one by mistake hangs.
:func:`open_regular` looks first (``os.stat``: a FIFO is named without being opened), then
opens without blocking and checks what it opened, and refuses anything but a regular file
with a message that says what it is. Every titan-rocm tool reads its inputs through it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def describe_mode(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for a message: ``a named pipe (FIFO)``..."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


class NotRegularFileError(OSError):
    """The path names something other than a regular file; ``kind`` says what."""

    def __init__(self, path: str | os.PathLike[str], mode: int) -> None:
        self.kind = describe_mode(mode)
        super().__init__(f"{Path(path)} is {self.kind}, not a regular file")


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only file descriptor of the regular file at ``path`` (symlinks followed).

    Raises:
        NotRegularFileError: ``path`` is a directory, FIFO, socket or device (never blocks).
        OSError: it cannot be opened (FileNotFoundError when missing).
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFileError(path, mode)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode  # the path may have changed since the stat
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFileError(path, mode)
    return fd


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file at ``path`` (see :func:`open_regular`)."""
    with os.fdopen(open_regular(path), "rb") as handle:
        return handle.read()
