"""The output folder of a run (``logging.output_dir``): one job at a time, never another run's results mixed
in, the resolved config saved, durable writes, and write failures reported with the path.

* A lock file held (``flock``) by rank 0 for the whole job refuses a second job on the same folder; the kernel
  drops it when the process ends, however it ends, so a killed job leaves no stale lock.
* A new run refuses a folder that holds another run's metrics or checkpoints unless it resumes
  (``checkpoint.resume=auto`` or a path).
* ``config.yaml`` holds the resolved config of the latest start, written atomically by rank 0.
* :func:`storage_errors` turns disk-full / read-only / permission failures, which torch and safetensors report
  in their own words, into one :class:`~vlm_grpoma.errors.StorageError` line naming the path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from vlm_grpoma.errors import StorageError
from vlm_grpoma.run_layout import CONFIG_FILE, LOCK_FILE, METRICS_FILE, checkpoint_root

_ERRNO_PROBLEMS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
}
#: How libraries that hide the errno (safetensors, torch's zip writer) word the same failures.
_TEXT_PROBLEMS = (
    ("No space left on device", "disk full"),
    ("Disk quota exceeded", "disk quota exceeded"),
    ("Read-only file system", "read-only file system"),
    ("Permission denied", "permission denied"),
)
#: Below this much free space after a failed write, the write failed because the disk is full.
_NEARLY_FULL_BYTES = 1 << 20


def _existing_ancestor(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def storage_problem(err: BaseException, path: str | Path) -> str | None:
    """ "disk full", "read-only file system", ... when ``err`` (raised while writing ``path``) is one, else None.

    torch.save reports a full disk as "unexpected pos ..." without an errno, so the file system is asked too.
    """
    if isinstance(err, OSError) and err.errno in _ERRNO_PROBLEMS:
        return _ERRNO_PROBLEMS[err.errno]
    text = str(err)
    for needle, problem in _TEXT_PROBLEMS:
        if needle in text:
            return problem
    if not isinstance(err, (OSError, RuntimeError)):
        return None
    try:
        stat = os.statvfs(_existing_ancestor(Path(path)))
    except OSError:
        return None
    if stat.f_flag & os.ST_RDONLY:
        return "read-only file system"
    if stat.f_bavail * stat.f_frsize < _NEARLY_FULL_BYTES:
        return "disk full"
    return None


@contextmanager
def storage_errors(path: str | Path, doing: str, hint: str = "") -> Iterator[None]:
    """Run a write to ``path``; a storage failure becomes ``StorageError("<doing>: <problem>: <path>[; hint]")``.

    Any other error passes unchanged (a bug keeps its traceback).
    """
    try:
        yield
    except StorageError:
        raise
    except Exception as err:
        problem = storage_problem(err, path)
        if problem is None:
            raise
        raise StorageError(f"{doing}: {problem}: {path}" + (f"; {hint}" if hint else "")) from None


def fsync_dir(path: str | Path) -> None:
    """Make the entries of folder ``path`` (created or renamed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a synced temporary file renamed over it: the old or the new content."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


class OutputLock:
    """The exclusive lock of one job on its output folder (rank 0); :meth:`release` or process exit frees it."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / LOCK_FILE
        if self.path.parent.exists() and not self.path.parent.is_dir():
            raise StorageError(
                f"logging.output_dir: {self.path.parent} is not a folder (a file or device is there)"
            )
        with storage_errors(self.path, "logging.output_dir"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a+", encoding="utf-8")  # closed in release()
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise StorageError(
                f"logging.output_dir: {self.path.parent} is in use by another job ({holder}); wait for it to "
                "end, or choose another logging.output_dir"
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(
            f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        )
        self._file.flush()

    def release(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()


def _metrics_rows(path: Path) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def refuse_foreign_run(output_dir: str | Path, resume: str) -> None:
    """A new run (``checkpoint.resume`` none) may not write into a folder holding another run's results."""
    if resume not in ("", "none"):
        return
    out = Path(output_dir)
    held = []
    if rows := _metrics_rows(out / METRICS_FILE):
        held.append(f"{METRICS_FILE} with {rows} row(s)")
    checkpoints = checkpoint_root(out)
    if checkpoints.is_dir() and (names := sorted(p.name for p in checkpoints.iterdir())):
        held.append(f"checkpoints/{names[-1]}" + (f" and {len(names) - 1} more" if len(names) > 1 else ""))
    if held:
        raise StorageError(
            f"logging.output_dir: {out} already holds a run ({', '.join(held)}); continue it with "
            "checkpoint.resume=auto, or choose a new logging.output_dir"
        )


def write_config(output_dir: str | Path, resolved: dict[str, Any]) -> Path:
    """``<output_dir>/config.yaml``: the resolved config (every key, defaults included), written atomically."""
    path = Path(output_dir) / CONFIG_FILE
    with storage_errors(path, "writing the run's config"):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True))
    return path
