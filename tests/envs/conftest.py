"""Generated PartNet-Mobility-format objects, written once per session."""

from __future__ import annotations

import pytest

from vlm_grpoma.envs.sapien.partnet import scan_assets
from vlm_grpoma.envs.sapien.partnet_export import generate_assets


@pytest.fixture(scope="session")
def generated_assets(tmp_path_factory):
    """Two objects of every generated category (each seen category with one train and one test object)."""
    root = tmp_path_factory.mktemp("partnet-assets")
    generate_assets(root, 2, seed=0)
    return scan_assets(root)
