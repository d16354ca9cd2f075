"""The checkpoint manifest: size and SHA-256 of every file of a checkpoint, written into checkpoint.json and
checked before a resume, with the hashing shared among the ranks. A missing or damaged file, a file the manifest
does not list (something added to the folder after the save: it would be loaded unchecked), or a manifest naming a
path outside the checkpoint folder, is one CheckpointError line naming it. The universal-checkpoint folder an
elastic resume adds later is checked against its own source digest instead (``trainer/elastic.py``)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from vlm_grpoma.errors import CheckpointError
from vlm_grpoma.run_layout import META_FILE, UNIVERSAL_DIR
from vlm_grpoma.trainer.collectives import collective

FORMAT_VERSION = 2  # 2: checkpoint.json carries the manifest
_HASH_CHUNK = 8 << 20


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def _digest(path: Path, sync: bool) -> tuple[int, str]:
    """(size, SHA-256) of a file, fsyncing it first when ``sync``."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        while chunk := f.read(_HASH_CHUNK):
            sha.update(chunk)
    return path.stat().st_size, sha.hexdigest()


def _shared(items: list[str], work, what: str, timeout_s: float | None) -> dict[str, Any]:
    """``{item: work(item)}`` with rank r doing ``items[r::world]``, gathered on every rank."""
    mine = {item: work(item) for item in items[rank() :: world_size()]}
    if world_size() == 1:
        return mine
    parts: list[dict[str, Any]] = [{} for _ in range(world_size())]
    with collective(what, timeout_s):
        torch.distributed.all_gather_object(parts, mine)
    return {key: value for part in parts for key, value in part.items()}


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` but checkpoint.json, as sorted POSIX paths relative to it."""
    return sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != META_FILE
    )


def build_manifest(folder: Path, timeout_s: float | None) -> dict[str, dict[str, Any]]:
    digests = _shared(
        _files(folder), lambda name: _digest(folder / name, sync=True), "the checkpoint hashing", timeout_s
    )
    return {name: {"size": size, "sha256": sha} for name, (size, sha) in sorted(digests.items())}


def read_meta(path: Path) -> dict[str, Any]:
    """checkpoint.json of a checkpoint folder; a missing, unreadable or incomplete one is a CheckpointError."""
    meta_file = path / META_FILE
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{meta_file}: missing; the checkpoint is incomplete") from None
    except RecursionError:
        raise CheckpointError(f"{meta_file}: unreadable (nested too deeply)") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{meta_file}: unreadable ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(
            f"{meta_file}: format {found!r}, expected {FORMAT_VERSION} (a checkpoint with a manifest); "
            "it was written by another version of vlm-grpoma or damaged"
        )
    missing = [k for k in ("step", "world_size", "files") if k not in meta]
    if missing or not isinstance(meta["files"], dict):
        raise CheckpointError(f"{meta_file}: damaged (no {', '.join(missing) or 'file list'})")
    for key, minimum in (("step", 0), ("world_size", 1)):
        if type(meta[key]) is not int or meta[key] < minimum:
            raise CheckpointError(
                f"{meta_file}: damaged ({key} {meta[key]!r} is not an integer >= {minimum})"
            )
    for name, entry in meta["files"].items():
        if not (
            isinstance(entry, dict)
            and type(entry.get("size")) is int
            and isinstance(entry.get("sha256"), str)
        ):
            raise CheckpointError(f"{meta_file}: damaged (the entry of {name!r} has no size and sha256)")
        if not _inside(path, name):
            raise CheckpointError(f"{meta_file}: damaged (names {name!r}, outside the checkpoint folder)")
    return meta


def _inside(folder: Path, name: str) -> bool:
    """Whether manifest entry ``name`` is a file path inside ``folder`` (relative, no ``..``, no symlink out)."""
    relative = Path(name)
    if not name or relative.is_absolute() or ".." in relative.parts:
        return False
    return (folder / relative).resolve().is_relative_to(folder.resolve())


def verify_checkpoint(path: Path, timeout_s: float | None = None) -> None:
    """Raise a CheckpointError naming the first file that is missing or differs from the manifest.

    Sizes are checked on every rank, the hashes shared among the ranks; every rank must call.
    """
    meta = read_meta(path)
    files = meta["files"]
    problems = [
        f"{path / name}: not in the checkpoint's manifest (added after the save); remove it"
        for name in _files(path)
        if name not in files and Path(name).parts[0] != UNIVERSAL_DIR
    ]
    for name, entry in files.items():
        file = path / name
        if not file.is_file():
            problems.append(f"{file}: missing")
        elif file.stat().st_size != entry.get("size"):
            problems.append(f"{file}: {file.stat().st_size} bytes, the manifest says {entry.get('size')}")
    if not problems:
        hashes = _shared(
            sorted(files), lambda name: _digest(path / name, sync=False)[1], "the checkpoint check", timeout_s
        )
        problems = [
            f"{path / n}: content differs from the manifest"
            for n in sorted(files)
            if hashes[n] != files[n].get("sha256")
        ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(f"{problems[0]}{more}")
