"""Fault-suite fixtures: the tiny model, a small shapes dataset and configs training it into a folder."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from fault_cli import register_fault_rewards
from fault_runs import BASE, REPO

os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
torch.set_num_threads(1)
register_fault_rewards()


@pytest.fixture(scope="session")
def tiny_path(tiny_model_dir) -> Path:
    return tiny_model_dir("qwen2_vl")


@pytest.fixture(scope="session")
def shapes_path(tmp_path_factory) -> Path:
    from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes

    return generate_shapes("detection", 8, tmp_path_factory.mktemp("shapes"), seed=0, config=EASY)


@pytest.fixture
def overrides(tiny_path: Path, shapes_path: Path) -> Callable[..., list[str]]:
    """``overrides(out_dir, "key=value", ...)``: the fault runs' settings training into ``out_dir``."""

    def make(out_dir: Path, *extra: str) -> list[str]:
        return [
            f"model.name_or_path={tiny_path}",
            f"data.train_path={shapes_path}",
            f"logging.output_dir={out_dir}",
            *BASE,
            *extra,
        ]

    return make


@pytest.fixture
def make_config(overrides) -> Callable[..., object]:
    from vlm_grpoma.config import load_config

    return lambda out_dir, *extra: load_config(None, overrides(out_dir, *extra))
