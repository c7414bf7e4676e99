"""Files replaced whole: a reader, or a crash, sees the old file or the new one, never half.

The one way streamrl replaces a file it shares with readers (the admin token and URL, the run
directory's ``pids.json`` and ``prompts.json``, the newest-checkpoint marker, a buffer log's
compacted segment, a Parquet export). The bytes go to a temporary file in the same directory
(a rename is atomic only within one file system), which ``os.replace`` then moves over the
target. The temporary name is ``.<name>.<random>.tmp``, created exclusively, so two writers of
the same file never share one, and a scan for ``*.tmp`` finds what a crash left behind.

``mode`` is set on the temporary file when it is created (``os.open``, then ``fchmod`` past
the umask), so a secret is never readable by others, not even for an instant. ``mode=None``
leaves it to the umask, as ``open()`` would. ``durable=True`` also survives a machine crash:
the file is fsynced before the rename and its directory after it.

Stdlib only: the CLI's light paths and the torch-free buffer shards import it.

Example: ``atomic_write_text(run_dir / "admin.token", token, mode=0o600)``;
``with atomic_writer(path, durable=True) as f: f.write(chunk)`` for a writer that streams.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(
    path: Path | str, *, mode: int | None = None, durable: bool = False
) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` when the ``with`` block ends without an error.

    On an error the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp, fd = _create_temporary(path, 0o666 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(path.parent)


def atomic_write_bytes(
    path: Path | str, data: bytes, *, mode: int | None = None, durable: bool = False
) -> None:
    """Replace ``path`` with ``data`` in one step (module doc)."""
    with atomic_writer(path, mode=mode, durable=durable) as f:
        f.write(data)


def atomic_write_text(
    path: Path | str, text: str, *, mode: int | None = None, durable: bool = False
) -> None:
    """Replace ``path`` with ``text`` (UTF-8) in one step (module doc)."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode, durable=durable)


def fsync_directory(directory: Path | str) -> None:
    """Make a rename or a new file in ``directory`` survive a machine crash; a file system
    that cannot fsync a directory is left as it is."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _create_temporary(path: Path, mode: int) -> tuple[Path, int]:
    """A new file beside ``path`` (``O_EXCL``: never one another writer holds)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
