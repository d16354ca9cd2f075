"""The shipped real architectures: every one builds on the meta device with the published parameter count."""

from __future__ import annotations

import json

import pytest

from vlm_grpoma.errors import ConfigError
from vlm_grpoma.models.architecture import (
    ARCHITECTURE_DIR,
    architecture_names,
    find_architecture,
    load_architecture,
    meta_model,
)
from vlm_grpoma.models.families import FAMILIES

#: Parameter counts of the released checkpoints (the hub's safetensors metadata: 2.21B, 8.29B, 3.75B, 8.29B,
#: 4.44B, 8.77B). Built from the shipped values with nothing downloaded, every count must come out exact.
PUBLISHED_PARAMETERS = {
    "Qwen2-VL-2B-Instruct": 2_208_985_600,
    "Qwen2-VL-7B-Instruct": 8_291_375_616,
    "Qwen2.5-VL-3B-Instruct": 3_754_622_976,
    "Qwen2.5-VL-7B-Instruct": 8_292_166_656,
    "Qwen3-VL-4B-Instruct": 4_437_815_808,
    "Qwen3-VL-8B-Instruct": 8_767_123_696,
}


def test_every_family_ships_and_every_file_names_its_sources():
    names = architecture_names()
    assert set(names) == set(PUBLISHED_PARAMETERS)
    assert {load_architecture(n).model_type for n in names} == set(FAMILIES)
    for entry in ARCHITECTURE_DIR.iterdir():
        data = json.loads(entry.read_text())
        assert data["sources"] and all(isinstance(s, str) and len(s) > 20 for s in data["sources"]), (
            entry.name
        )


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_real_architecture_builds_on_the_meta_device_with_the_published_size(name):
    arch = load_architecture(name)
    config = arch.transformers_config()
    model = meta_model(config)
    params = list(model.parameters())
    assert all(p.device.type == "meta" for p in params)
    assert sum(p.numel() for p in params) == PUBLISHED_PARAMETERS[name]
    text = config.get_text_config()
    shipped = arch.config.get("text_config", arch.config)
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (
        shipped["hidden_size"],
        shipped["num_hidden_layers"],
        shipped["vocab_size"],
    )
    assert model.get_input_embeddings().weight.shape == (text.vocab_size, text.hidden_size)
    family = FAMILIES[arch.model_type]
    assert config.vision_config.patch_size == family.patch_size == arch.processor.patch_size
    assert arch.processor.factor == family.factor
    if arch.model_type == "qwen2_5_vl":  # the window attention the tiny presets shrink
        assert config.vision_config.window_size == 112
        assert config.vision_config.fullatt_block_indexes == [7, 15, 23, 31]


def test_smaller_stand_ins_change_only_the_language_model():
    arch = load_architecture("Qwen2-VL-2B-Instruct")
    config = arch.transformers_config(num_hidden_layers=2)
    assert config.get_text_config().num_hidden_layers == 2 and config.vision_config.depth == 32
    with pytest.raises(
        ConfigError, match=r"^Qwen2-VL-2B-Instruct: the language model config has no 'layerz'$"
    ):
        arch.transformers_config(layerz=2)


def test_lookup_by_hub_id_name_or_path():
    arch = load_architecture("Qwen2.5-VL-3B-Instruct")
    assert find_architecture("Qwen/Qwen2.5-VL-3B-Instruct") is arch
    assert find_architecture("/models/qwen2.5-vl-3b-instruct/") is arch
    assert find_architecture("runs/tiny") is None
    with pytest.raises(
        ConfigError, match=r"^unknown architecture 'Qwen9'; shipped architectures: Qwen2-VL-2B"
    ):
        load_architecture("Qwen9")
