"""Reading input files without blocking on non-files, and writing output files atomically.

``open()`` on a FIFO waits for a writer forever; a rename means no reader sees half a file."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path


def describe_mode(mode: int) -> str:
    """For a message: ``a named pipe (FIFO)``..."""
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
    """A read-only descriptor of the regular file at ``path``, without ever blocking.

    NotRegularFileError for a directory, FIFO, socket or device; OSError otherwise."""
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
    """The bytes of the regular file at ``path``; TooLargeError past ``limit``, having read no
    more."""
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
    """Write ``data`` to ``path`` through a temporary file and a rename; on OSError ``path`` is
    as it was."""
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

    All are staged before any is renamed, so a full disk or Ctrl-C changes no destination.
    Raises PartialWrite naming what was and was not written."""
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
    """Same ``st_dev``/``st_ino`` (links too); False when either does not exist."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class OutputError(ValueError):
    """An output path that would destroy or cannot hold what is written; the message says why."""


def check_output(output: Path, inputs: Sequence[str | os.PathLike[str]], flag: str = "-o") -> None:
    """Refuse, before any work, an ``output`` that is an input (also through a link), not a regular
    file, or not writable (OutputError)."""
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
