"""``vlm-grpoma check-data``: every record, image and mask checked up front, errors as file:line in file
order, counts per task/split, image sizes and the prompt tokens each record becomes for a model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.check import check_records
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.models.prompt_check import prompt_lengths


def record(rid, image, width, height, task="detection", split="train", ground_truth=None):
    return {
        "id": rid,
        "image": image,
        "task": task,
        "prompt": "the thing",
        "width": width,
        "height": height,
        "split": split,
        "ground_truth": ground_truth or {"boxes": [{"bbox_2d": [1, 1, 5, 5], "label": "thing"}]},
    }


@pytest.fixture
def mixed(tmp_path):
    """Eight lines: good records of two splits, then one of each problem the check must catch."""
    Image.new("RGB", (64, 48), "white").save(tmp_path / "ok.png")
    Image.new("RGB", (402, 2), "white").save(tmp_path / "sliver.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    Image.new("L", (64, 48), 0).save(tmp_path / "empty_mask.png")
    mask = np.zeros((48, 64), np.uint8)
    mask[10:20, 10:20] = 255
    Image.fromarray(mask).save(tmp_path / "mask.png")
    lines = [
        record("a", "ok.png", 64, 48),
        record("b", "ok.png", 64, 48, split="val"),
        record("c", "ok.png", 64, 48, task="affordance", ground_truth={"mask": "mask.png"}),
        record("d", "ok.png", 100, 48),  # size mismatch
        record("e", "missing.png", 64, 48),
        "{not json",
        record("g", "sliver.png", 402, 2, ground_truth={"boxes": [{"bbox_2d": [0, 0, 5, 2]}]}),
        record("h", "broken.png", 64, 48),
        record("i", "ok.png", 64, 48, task="affordance", ground_truth={"mask": "empty_mask.png"}),
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_every_problem_is_found_once_in_file_order(mixed):
    check = check_records([mixed])
    assert [r.id for r in check.records] == ["a", "b", "c"]
    assert check.where == [f"{mixed}:1", f"{mixed}:2", f"{mixed}:3"]
    assert check.lines == 9 and not check.ok
    expected = [
        (4, "is 64x48 (after EXIF orientation) but the record says 100x48"),
        (5, "image file not found"),
        (6, "invalid JSON"),
        (7, "aspect ratio 201:1 is above the 200:1"),
        (8, "cannot decode image"),
        (9, "mask is empty"),
    ]
    assert len(check.errors) == len(expected)
    for message, (line, problem) in zip(check.errors, expected):
        assert message.startswith(f"{mixed}:{line}") and problem in message, message
    assert check.counts() == {("detection", "train"): 1, ("detection", "val"): 1, ("affordance", "train"): 1}
    assert check.image_sizes == {
        str(mixed.parent / "ok.png"): (64, 48),
        str(mixed.parent / "sliver.png"): (402, 2),
    }
    records_only = check_records([mixed], files=False)
    assert len(records_only.errors) == 1 and "invalid JSON" in records_only.errors[0]


def test_prompt_tokens_match_the_processor_and_smart_resize(tmp_path, tiny_model_dir):
    from vlm_grpoma.config import ModelConfig
    from vlm_grpoma.models.registry import load_adapter

    data = generate_shapes("detection", 3, tmp_path, seed=0, config=EASY)  # 112 x 112 images
    check = check_records([data])
    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_5_vl")), max_pixels=112 * 112))
    lengths = prompt_lengths(check, adapter)
    # 112 px = 8 patches of 14 per side; 2x2 patches merge into one token: 16 image tokens
    assert lengths.image == [16, 16, 16]
    for record, total in zip(check.records, lengths.total):
        text = adapter.processor.apply_chat_template(
            adapter.messages(record), tokenize=False, add_generation_prompt=True
        )
        one_pad = len(adapter.tokenizer(text, add_special_tokens=False).input_ids)
        assert total == one_pad - 1 + 16


def test_cli_prints_the_summary_and_fails_with_the_first_errors(mixed, tiny_model_dir, capsys):
    assert cli_main(["check-data", str(mixed), "--max-errors", "2"]) == 1
    captured = capsys.readouterr()
    assert "records: 3 valid of 9 read, 6 with errors" in captured.out
    assert "  detection/val: 1" in captured.out and "images: 2 distinct; width 64-402" in captured.out
    assert "errors (first 2 of 6):" in captured.out and f"{mixed}:4: record d" in captured.out
    assert f"{mixed}:6" not in captured.out  # only the first two are printed
    assert captured.err.startswith("vlm-grpoma check-data: error: 6 of 9 record(s) failed the check")


def test_cli_with_a_config_checks_its_data_paths_and_counts_tokens(tmp_path, tiny_model_dir, capsys):
    data = generate_shapes("detection", 2, tmp_path / "d", seed=0, config=EASY)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{name_or_path: {tiny_model_dir('qwen2_5_vl')}, max_pixels: 12544, prompt_style: compact}}\n"
        f"data: {{train_path: {data}}}\n"
        "rollout: {max_thought_tokens: 24, max_answer_tokens: 48}\n"
    )
    assert cli_main(["check-data", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "records: 2 valid of 2 read, 0 with errors" in out
    assert "pixels 3136-12544, compact prompts" in out and "image tokens min 16" in out
    assert "longest sequence:" in out and "+ 24 thought + 48 answer tokens" in out
