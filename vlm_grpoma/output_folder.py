"""Check an output folder before the work that fills it: a command that would fail only when it writes its
results (after minutes of rendering or evaluation) fails first instead, in one line naming the option.

:func:`writable_folder` creates the folder, then proves it writable with a probe file and a free-space floor, so
a path under a file, a read-only or full file system, or a folder without write permission is a
:class:`~vlm_grpoma.errors.StorageError` up front.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from vlm_grpoma.errors import StorageError

#: Bytes a folder must have free before a command starts writing into it (results, images, weights).
MIN_FREE_BYTES = 1 << 20


def writable_folder(folder: str | Path, option: str, min_free_bytes: int = MIN_FREE_BYTES) -> Path:
    """``folder`` created if needed and shown writable (a probe file written and removed, ``min_free_bytes``
    free); otherwise StorageError ``"<option> <folder>: <problem>"``."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise StorageError(f"{option} {folder}: exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-") as probe:
            probe.write(b"probe")
            probe.flush()
            os.fsync(probe.fileno())
        stats = os.statvfs(folder)
    except OSError as err:
        raise StorageError(f"{option} {folder}: cannot write there ({err.strerror or err})") from None
    free = stats.f_bavail * stats.f_frsize
    if free < min_free_bytes:
        raise StorageError(f"{option} {folder}: only {free} bytes free, need at least {min_free_bytes}")
    return folder


__all__ = ["MIN_FREE_BYTES", "writable_folder"]
