"""Shared model fixtures: tiny Qwen-VL checkpoints of every family, built once per session, offline."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from vlm_grpoma.models.families import ARCHS


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``tiny_model_dir(arch, preset="tiny", seed=0)`` → a saved checkpoint folder (built on first use)."""
    from vlm_grpoma.models.tiny import build_tiny_model

    built: dict[tuple[str, str, int], Path] = {}

    def get(arch: str, preset: str = "tiny", seed: int = 0) -> Path:
        key = (arch, preset, seed)
        if key not in built:
            out = tmp_path_factory.mktemp(f"tiny-{arch}-{preset}-{seed}")
            built[key] = build_tiny_model(arch, out, seed=seed, preset=preset)
        return built[key]

    return get


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    """Each Qwen-VL family in turn."""
    return request.param


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scheduling for ``pytest -n 2 --dist loadgroup`` (``make test``): the launcher tests, which start several
    ranks each, run one at a time on one worker; the slow ones start first, so the run does not end with one
    long test on one worker while the other idles. A run without xdist keeps the files' order."""
    for item in items:
        if item.get_closest_marker("launcher"):
            item.add_marker(pytest.mark.xdist_group("launcher"))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
