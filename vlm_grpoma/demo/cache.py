"""What a demo re-run may reuse: folders keyed by everything that produced them.

An entry is ``<root>/<kind>-<key>/``; the key is a digest of its inputs (plan sizes, seeds, library versions
and a digest of the package source that builds it), and ``entry.json`` inside, written last, records those
inputs. An entry is reused only when that file exists and names the same inputs, so an interrupted build or
a changed plan or code is rebuilt; building an entry first removes the other entries of its kind.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import vlm_grpoma

MARKER = "entry.json"
PACKAGE = Path(vlm_grpoma.__file__).resolve().parent


def source_digest(parts: Iterable[str]) -> str:
    """SHA-256 of the package files under ``parts`` (paths relative to the package, e.g. ``envs`` or
    ``answers.py``): their names and bytes, Python sources and the config files shipped with them."""
    digest = hashlib.sha256()
    for part in sorted(parts):
        base = PACKAGE / part
        files = [base] if base.is_file() else sorted(base.rglob("*"))
        for path in files:
            if path.is_file() and path.suffix in (".py", ".yaml", ".json"):
                digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """One cached folder of kind ``kind`` (``data``, ``warm-start``) under ``root``, built from ``inputs``."""

    root: Path
    kind: str
    inputs: dict[str, Any]

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.inputs, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def path(self) -> Path:
        return self.root / f"{self.kind}-{self.key}"

    def built_seconds(self) -> float | None:
        """Seconds the entry took to build when it is complete and was built from these inputs, else None."""
        try:
            marker = json.loads((self.path / MARKER).read_text())
        except (OSError, ValueError):
            return None
        return float(marker["seconds"]) if marker.get("inputs") == self.inputs else None

    def start(self) -> Path:
        """An empty folder for this entry; stale entries of this kind (and a half-built one) are removed."""
        for old in self.root.glob(f"{self.kind}-*"):
            shutil.rmtree(old)
        self.path.mkdir(parents=True)
        return self.path

    def finish(self, seconds: float) -> None:
        """Mark the entry complete (the last write of a build)."""
        marker = {"inputs": self.inputs, "seconds": seconds, "finished_at": time.time()}
        (self.path / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
