"""Every process of one environment JIT-builds DeepSpeed's ops with the same ninja, in the suite's cache, in a
folder of its torch version."""

from __future__ import annotations

import os

import pytest

from vlm_grpoma.cache import cache_dir
from vlm_grpoma.distributed import jit_ops_tag, prepare_jit_builds


def test_the_environment_ninja_goes_first_on_path_once(monkeypatch):
    ninja = pytest.importorskip("ninja")
    if not ninja.BIN_DIR:
        pytest.skip("the ninja package found no ninja executable of this environment")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    prepare_jit_builds()
    prepare_jit_builds()
    assert os.environ["PATH"] == f"{ninja.BIN_DIR}:/usr/bin:/bin"
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(cache_dir() / "torch_extensions" / jit_ops_tag())

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/elsewhere")  # a user's choice wins, per torch version too
    prepare_jit_builds()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == f"/elsewhere/{jit_ops_tag()}"
