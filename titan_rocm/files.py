"""Opening input files without blocking on ones that are not files (a FIFO, a device), and
writing output files atomically.

``open()`` on a FIFO waits for a writer forever, so a tool given one by mistake hangs.
:func:`open_regular` looks first (``os.stat``: a FIFO is named without being opened), then
opens without blocking and checks what it opened, and refuses anything but a regular file
with a message that says what it is. Every titan-rocm tool reads its inputs through it.
:func:`write_atomic` and :func:`write_all` write through a temporary file and a rename, so a
reader never sees half a file and a failed write leaves the destination as it was.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
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


def _stage(path: Path, data: bytes | Iterable[bytes]) -> str:
    """``data`` (bytes, or pieces of them: a stream is written as it comes) in a temporary
    file beside ``path`` (synced, with the permissions a new file gets: 0666 minus the
    umask); the temporary file's name."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            for piece in [data] if isinstance(data, bytes) else data:
                handle.write(piece)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename.

    Raises:
        OSError: as the write or rename raised it; ``path`` is then as it was.
    """
    try:
        write_all([(path, data)])
    except PartialWrite as exc:
        raise exc.cause from None


class PartialWrite(Exception):
    """Writing stopped (an OSError or Ctrl-C, in ``cause``) after ``written`` of the files."""

    def __init__(self, written: list[Path], not_written: list[Path], cause: BaseException):
        self.written, self.not_written, self.cause = written, not_written, cause
        super().__init__(str(cause))


def write_all(files: Sequence[tuple[Path, bytes | Iterable[bytes]]]) -> None:
    """Write every ``(path, data)`` atomically, all of them or (nearly) none.

    ``data`` may be an iterable of byte pieces (a generator that reads while it yields):
    an exception it raises is the ``cause`` of :class:`PartialWrite`, with nothing renamed.

    Every file is first written to a temporary file beside its destination; only when all
    are on disk are they renamed into place, so a full disk or a Ctrl-C while writing
    leaves every destination as it was. Only a failure among the renames (rare: same
    directory) leaves some tables replaced and others not.

    Raises:
        PartialWrite: with the destinations written and not written, and the cause.
    """
    staged: list[tuple[str, Path]] = []
    written: list[Path] = []
    try:
        for path, data in files:
            staged.append((_stage(path, data), path))
        for tmp, path in staged:
            os.replace(tmp, path)
            written.append(path)
    except BaseException as exc:
        for tmp, _ in staged:
            _unlink(tmp)
        not_written = [path for path, _ in files if path not in written]
        raise PartialWrite(written, not_written, exc) from None
