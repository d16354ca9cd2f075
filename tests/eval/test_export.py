"""``vlm-grpoma export``: a LoRA checkpoint of each family merged into a folder that transformers loads on its
own (same logits as the adapter applied in memory, processor and chat template, generation config, no path of
the source machine), adapters recording a relative base, ``--base`` for a run moved without its base, and
every refusal one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.models.sources import adapter_chain, record_portable_base

PROMPT = "the red square is left of the blue circle"


def _lora_run(base, run, seed=0):
    """A run folder whose step-1 checkpoint is a LoRA adapter (non-zero B, so merging changes the weights)
    on ``base``, saved as the trainer saves it; returns (model folder, the adapter model in memory)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
    peft = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|v_proj)")
    )
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    step = run / "checkpoints" / "step-00000001"
    peft.save_pretrained(step / "model")
    record_portable_base(step / "model")
    AutoProcessor.from_pretrained(base).save_pretrained(step / "model")
    (step / "checkpoint.json").write_text("{}")
    return step / "model", peft.eval()


def _logits(model, base):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(base)(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits


def _assert_self_contained(out, forbidden):
    for path in out.rglob("*.json"):
        assert forbidden not in path.read_text(), f"{path.name} names {forbidden}"
    assert (out / "generation_config.json").is_file() and (out / "model.safetensors").is_file()


def test_merged_lora_export_loads_in_transformers_alone(arch, tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.set_num_threads(1)
    base = tiny_model_dir(arch)
    model_dir, adapter = _lora_run(base, tmp_path / "run")
    recorded = json.loads((model_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert not recorded.startswith("/") and adapter_chain(model_dir).base == str(base.resolve())

    out = tmp_path / "exported"
    assert cli_main(["export", str(tmp_path / "run"), "--out", str(out), "--merge-lora"]) == 0
    assert f"(merged LoRA) to {out}" in capsys.readouterr().out
    _assert_self_contained(out, str(tmp_path))
    _assert_self_contained(out, str(base))
    shutil.rmtree(tmp_path / "run")  # nothing of the run is needed any more

    loaded = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32).eval()
    expected = _logits(adapter, base)
    assert not torch.allclose(expected, _logits(AutoModelForImageTextToText.from_pretrained(base), base))
    torch.testing.assert_close(_logits(loaded, base), expected, rtol=1e-4, atol=1e-4)
    processor = AutoProcessor.from_pretrained(out)
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], tokenize=False
    )
    assert "hi" in text and "<|im_start|>" in text  # the chat template came along


def test_full_weights_export_keeps_the_model(tiny_model_dir, tmp_path):
    from transformers import AutoModelForImageTextToText

    base = tiny_model_dir("qwen2_vl")
    assert cli_main(["export", str(base), "--out", str(tmp_path / "out")]) == 0
    _assert_self_contained(tmp_path / "out", str(base))
    original = AutoModelForImageTextToText.from_pretrained(base).eval()
    exported = AutoModelForImageTextToText.from_pretrained(tmp_path / "out").eval()
    torch.testing.assert_close(_logits(exported, base), _logits(original, base), rtol=0, atol=0)


def test_a_run_moved_without_its_base_exports_with_base(tiny_model_dir, tmp_path, capsys):
    base = tiny_model_dir("qwen2_5_vl")
    copied_base = tmp_path / "machine-a" / "base"
    shutil.copytree(base, copied_base)
    _lora_run(copied_base, tmp_path / "machine-a" / "run")
    moved = tmp_path / "machine-b" / "run"
    shutil.copytree(tmp_path / "machine-a" / "run", moved)
    shutil.rmtree(tmp_path / "machine-a")
    command = ["export", str(moved), "--out", str(tmp_path / "out"), "--merge-lora"]
    capsys.readouterr()
    assert cli_main(command) == 1
    err = capsys.readouterr().err
    assert err.startswith("vlm-grpoma export: error: ") and "export --base" in err and err.count("\n") == 1
    assert cli_main([*command, "--base", str(base)]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_refusals_are_one_line(tiny_model_dir, tmp_path, capsys):
    base = tiny_model_dir("qwen2_5_vl")
    model_dir, _ = _lora_run(base, tmp_path / "run")
    capsys.readouterr()
    assert cli_main(["export", str(model_dir), "--out", str(tmp_path / "out")]) == 1  # local base, no merge
    assert "pass --merge-lora for a self-contained folder" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep me")
    assert cli_main(["export", str(base), "--out", str(tmp_path / "taken")]) == 1
    assert capsys.readouterr().err == (
        f"vlm-grpoma export: error: --out {tmp_path / 'taken'}: exists and is not an empty folder; name a new one\n"
    )
    assert (tmp_path / "taken" / "x").read_text() == "keep me"
    assert not list(tmp_path.glob(".tmp-export-*"))


def test_an_adapter_file_that_links_out_of_its_folder_is_refused(tmp_path, capsys):
    """Before: export copied the file a symlink pointed at (anywhere on the machine) into the export."""
    secret = tmp_path / "secret-key"
    secret.write_text("not model weights")
    adapter = tmp_path / "downloaded" / "model"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "Qwen/Qwen2-VL-2B-Instruct"})
    )
    (adapter / "adapter_model.safetensors").symlink_to(secret)
    assert cli_main(["export", str(adapter), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"adapter_model.safetensors: a symlink to {secret}, outside the model folder" in err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


@pytest.mark.vllm
def test_cpu_vllm_loads_the_exported_folder(tiny_model_dir, tmp_path):
    """The CPU vLLM build serves the merged export through the suite's own vLLM engine, and its greedy
    answers are transformers' (the ``small`` preset: vLLM's CPU attention has no kernel for the tiny preset's
    head size)."""
    pytest.importorskip("vllm")
    from PIL import Image

    from vlm_grpoma.answers import Box, Boxes
    from vlm_grpoma.config import Config, ModelConfig, RolloutConfig, VLLMConfig
    from vlm_grpoma.datasets.schema import Record
    from vlm_grpoma.models.loading import load_model
    from vlm_grpoma.rollout.backends import build_rollout_engine
    from vlm_grpoma.rollout.hf import HFRolloutEngine
    from vlm_grpoma.sampling import SamplingParams

    torch.set_num_threads(1)
    base = tiny_model_dir("qwen2_5_vl", preset="small")
    _lora_run(base, tmp_path / "run")
    out = tmp_path / "out"
    assert cli_main(["export", str(tmp_path / "run"), "--out", str(out), "--merge-lora"]) == 0
    Image.new("RGB", (96, 80), (40, 120, 200)).save(tmp_path / "x.png")
    record = Record(
        id="x",
        image=str(tmp_path / "x.png"),
        task="detection",
        prompt="the square",
        width=96,
        height=80,
        ground_truth=Boxes((Box(1, 1, 9, 9),)),
    )
    model_cfg = ModelConfig(name_or_path=str(out), dtype="float32", max_pixels=112 * 112)
    loaded = load_model(model_cfg)
    loaded.model.eval()
    vllm = VLLMConfig(enforce_eager=True, kv_cache_gib=0.25, max_model_len=1024)
    config = Config(model=model_cfg, rollout=RolloutConfig(backend="vllm", vllm=vllm))
    engine = build_rollout_engine(config, loaded.model, loaded.adapter)
    prompts = loaded.adapter.build_inputs([record])
    params = SamplingParams(
        num_thoughts=1,
        answers_per_thought=1,
        temperature=0.0,
        max_thought_tokens=6,
        max_answer_tokens=6,
        seed=0,
    )
    served = engine.sample(prompts, params)
    reference = HFRolloutEngine.for_adapter(loaded.model, loaded.adapter).sample(prompts, params)
    assert served.thought_texts == reference.thought_texts and served.answer_texts == reference.answer_texts
