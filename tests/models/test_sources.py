"""LoRA adapter folders load everywhere: the base is found from the adapter config (through chains of adapters),
the merged weights equal W + B·A·alpha/r computed from the saved tensors, and a new LoRA names its real base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlm_grpoma.config import LoraConfig, ModelConfig
from vlm_grpoma.errors import CheckpointError
from vlm_grpoma.models.loading import load_model, load_pretrained, prepare_trainable
from vlm_grpoma.models.registry import load_adapter
from vlm_grpoma.models.sources import adapter_chain, is_adapter_folder

R, ALPHA = 4, 8


def random_lora(base: str | Path, seed: int) -> torch.nn.Module:
    """A PeftModel LoRA on ``base`` (full folder or adapter folder) with random non-zero A and B."""
    torch.manual_seed(seed)
    model_cfg = ModelConfig(
        name_or_path=str(base), dtype="float32", lora=LoraConfig(enabled=True, r=R, alpha=ALPHA, dropout=0.0)
    )
    peft_model = prepare_trainable(load_pretrained(model_cfg, torch.float32), model_cfg)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.1)
    return peft_model


def save_random_lora(base: str | Path, out: Path, seed: int) -> Path:
    """:func:`random_lora` saved like a checkpoint's model/ folder (adapter + processor)."""
    random_lora(base, seed).save_pretrained(out)
    load_adapter(ModelConfig(name_or_path=str(base))).processor.save_pretrained(out)
    return out


def merged_by_hand(weights: dict[str, torch.Tensor], adapter: Path) -> dict[str, torch.Tensor]:
    """W + B @ A * alpha / r from the adapter's safetensors file: an independent reference for the merge."""
    lora = load_file(adapter / "adapter_model.safetensors")
    out = dict(weights)
    for key in lora:
        if ".lora_A." not in key:
            continue
        module = key.split(".lora_A.")[0].removeprefix("base_model.model.")
        a, b = lora[key], lora[key.replace(".lora_A.", ".lora_B.")]
        out[f"{module}.weight"] = out[f"{module}.weight"] + b @ a * (ALPHA / R)
    return out


@pytest.fixture(scope="module")
def full(tiny_model_dir) -> Path:
    return tiny_model_dir("qwen2_5_vl")


def test_full_folder_and_hub_id_are_their_own_base(full):
    chain = adapter_chain(full)
    assert chain.base == str(full.resolve()) and chain.adapters == () and not chain.is_adapter
    assert adapter_chain("Qwen/Qwen2.5-VL-3B-Instruct").base == "Qwen/Qwen2.5-VL-3B-Instruct"


def test_adapter_and_chain_of_adapters_merge_to_the_hand_computed_weights(full, tmp_path):
    first = save_random_lora(full, tmp_path / "sft" / "model", seed=1)
    second = save_random_lora(first, tmp_path / "grpo" / "model", seed=2)
    assert is_adapter_folder(first) and is_adapter_folder(second)
    # the second LoRA was trained on the merged first one: its config names the first folder, not the bare base
    assert json.loads((second / "adapter_config.json").read_text())["base_model_name_or_path"] == str(first)
    assert adapter_chain(second).adapters == (str(first), str(second))
    assert adapter_chain(second).base == str(full.resolve())

    base = load_model(ModelConfig(name_or_path=str(full), dtype="float32")).model.state_dict()
    expected = merged_by_hand(merged_by_hand(base, first), second)
    loaded = load_model(ModelConfig(name_or_path=str(second), dtype="float32"))
    got = loaded.model.state_dict()
    assert got.keys() == base.keys()  # plain model: no lora_ / base_layer keys left
    changed = [k for k in base if not torch.equal(base[k], expected[k])]
    assert len(changed) >= 14
    for key in base:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-5)
    assert loaded.adapter.family.model_type == "qwen2_5_vl"
    assert loaded.model.name_or_path == str(second)


def test_missing_base_or_cycle_is_one_clear_error(full, tmp_path):
    adapter = save_random_lora(full, tmp_path / "a", seed=3)
    config_file = adapter / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = str(tmp_path / "moved-away")
    config_file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="moved-away.*is not found"):
        load_model(ModelConfig(name_or_path=str(adapter)))
    config["base_model_name_or_path"] = str(adapter)
    config_file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="cycle"):
        adapter_chain(adapter)
    config["base_model_name_or_path"] = "../" + full.name  # relative to the adapter folder, as copied by hand
    (tmp_path / full.name).symlink_to(full)
    config_file.write_text(json.dumps(config))
    assert adapter_chain(adapter).base == str(full.resolve())


def test_adapter_folder_loads_like_the_trainers_merged_export(full, tmp_path):
    """checkpoint.merge_lora=true writes merged weights with its own merge; loading the adapter folder agrees."""
    from vlm_grpoma.trainer.checkpoint import merged_lora_state_dict

    peft_model = random_lora(full, seed=4)
    peft_model.save_pretrained(tmp_path / "adapter")
    exported = merged_lora_state_dict(peft_model, peft_model.state_dict())
    loaded = load_model(
        ModelConfig(name_or_path=str(tmp_path / "adapter"), dtype="float32")
    ).model.state_dict()
    assert loaded.keys() == exported.keys()
    for key in loaded:
        torch.testing.assert_close(loaded[key], exported[key], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_training_from_an_adapter_folder_under_zero(full, tmp_path, zero_stage):
    """SFT with LoRA started from a LoRA folder: ZeRO-3 partitions weights as they load, so the merge happens
    on whole weights first; the new adapter names the folder it started from."""
    from vlm_grpoma.config import load_config
    from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
    from vlm_grpoma.trainer.sft import SFTTrainer

    start = save_random_lora(full, tmp_path / "start", seed=5)
    data = generate_shapes("detection", 4, tmp_path / "data", seed=0, config=EASY)
    config = load_config(
        None,
        [
            f"model.name_or_path={start}",
            "model.dtype=float32",
            "model.lora.enabled=true",
            f"data.train_path={data}",
            f"logging.output_dir={tmp_path / 'run'}",
            "logging.progress_bar=false",
            "train.steps=1",
            "train.prompts_per_step=2",
            "train.micro_batch_prompts=2",
            f"deepspeed.zero_stage={zero_stage}",
        ],
    )
    run = SFTTrainer(config)
    run.train()
    run.engine.close()
    saved = json.loads((run.final_model_dir / "adapter_config.json").read_text())
    recorded = saved["base_model_name_or_path"]  # relative to the adapter, never this machine's absolute path
    assert not recorded.startswith("/") and (run.final_model_dir / recorded).resolve() == start.resolve()
    assert adapter_chain(run.final_model_dir).adapters == (str(start), str(run.final_model_dir.resolve()))
    # the run started from the merged start weights: one step at lr 1e-6 on a zero-initialised B moves little
    before = load_model(ModelConfig(name_or_path=str(start), dtype="float32")).model.state_dict()
    after = load_model(ModelConfig(name_or_path=str(run.final_model_dir), dtype="float32")).model.state_dict()
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=1e-4)
