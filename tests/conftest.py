"""Shared model fixtures: tiny Qwen-VL checkpoints of every family, built once per session, offline."""

from __future__ import annotations

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
