"""Reading input files without blocking on ones that are not files (a FIFO, a device).

``open()`` on a FIFO waits for a writer forever, so a tool given one by mistake hangs.
:func:`read_regular` opens without blocking, checks what it opened, and refuses anything
but a regular file with a message that says what it is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotRegularFileError(OSError):
    """The path names something other than a regular file (the message says what)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed).

    Raises:
        NotRegularFileError: ``path`` is a directory, FIFO, socket or device (never blocks).
        OSError: it cannot be opened or read (FileNotFoundError when missing).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{Path(path)} is {_kind(mode)}, not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)
