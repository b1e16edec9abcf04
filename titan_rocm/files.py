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


class TooLargeError(ValueError):
    """A file read whole is larger than its reader accepts; ``str()`` names both sizes."""

    def __init__(self, path: str | os.PathLike[str], size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"{Path(path)} is {size} bytes; accepted: at most {limit} bytes")


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (see :func:`open_regular`).

    Raises:
        TooLargeError: the file holds more than ``limit`` bytes (then nothing more is read,
            so memory stays bounded by ``limit``).
    """
    with os.fdopen(open_regular(path), "rb") as handle:
        if limit is None:
            return handle.read()
        size = os.fstat(handle.fileno()).st_size
        if size > limit:  # refused before a byte is read
            raise TooLargeError(path, size, limit)
        data = handle.read(limit + 1)  # the file may have grown since the fstat
        if len(data) > limit:
            raise TooLargeError(path, max(os.fstat(handle.fileno()).st_size, len(data)), limit)
        return data


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


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """``a`` and ``b`` are one file (the same ``st_dev``/``st_ino``: through a symlink or a
    hard link too); False when either does not exist."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class OutputError(ValueError):
    """An output path that would destroy or cannot hold what is written; the message says
    why and what to do."""


def check_output(output: Path, inputs: Sequence[str | os.PathLike[str]], flag: str = "-o") -> None:
    """Refuse an ``output`` that is one of the ``inputs`` (also through a link), that is not a
    regular file, or whose directory cannot be written, before any work is done.

    Raises:
        OutputError: naming the path and the reason.
    """
    for source in inputs:
        if same_file(output, source):
            raise OutputError(
                f"{flag} {output} is the input {source} (the same file); writing it would "
                "destroy the input: write to another file")
    try:
        mode = os.stat(output).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise OutputError(f"{flag} {output}: cannot be used ({exc.strerror or exc})") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise OutputError(f"{flag} {output} is {describe_mode(mode)}, not a regular file: "
                          "name a file to write")
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"{flag} {output}: its directory {parent} does not exist")
    try:  # really try: permission bits say nothing to root, nor about a read-only mount
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{output.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
        if mode is not None:
            os.close(os.open(output, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        raise OutputError(f"{flag} {output}: cannot write there ({exc.strerror or exc})") \
            from None
