"""mRoPE positions with a video (Qwen2/2.5-VL): the reference rule, by hand; the model's own rule for images."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from vlm_grpoma.config import ModelConfig
from vlm_grpoma.models.base import collate, rope_index_owner, rope_positions
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.models.positions import video_positions


def _owner(tiny_model_dir, arch):
    loaded = load_model(ModelConfig(name_or_path=str(tiny_model_dir(arch)), dtype="float32", max_images=2))
    return rope_index_owner(loaded.model), loaded.adapter


def test_text_after_a_video_continues_past_its_last_time_step(tiny_model_dir):
    """3 text tokens, a video of 2 temporal patches of 2 x 2 merged tokens, 2 text tokens, left-padded by 1:
    on Qwen2.5-VL each temporal patch is tokens_per_second * second_per_grid_ts positions apart."""
    owner, adapter = _owner(tiny_model_dir, "qwen2_5_vl")
    step = owner.config.vision_config.tokens_per_second * 1.5
    video = adapter.tokens.video_id
    batch = {
        "input_ids": torch.tensor([[0, 1, 2, 3, *[video] * 8, 4, 5]]),
        "attention_mask": torch.tensor([[0] + [1] * 13]),
        "mm_token_type_ids": torch.tensor([[0, 0, 0, 0, *[2] * 8, 0, 0]]),
        "video_grid_thw": torch.tensor([[2, 4, 4]]),
        "second_per_grid_ts": torch.tensor([1.5]),
    }
    t = [3] * 4 + [3 + int(step)] * 4
    h, w = [3 + v for v in (0, 0, 1, 1) * 2], [3 + v for v in (0, 1, 0, 1) * 2]
    after = 3 + int(step) + 1
    expected = torch.tensor(
        [
            [0, 0, 1, 2, *t, after, after + 1],
            [0, 0, 1, 2, *h, after, after + 1],
            [0, 0, 1, 2, *w, after, after + 1],
        ]
    )
    got = video_positions(owner.config, batch)
    assert torch.equal(got[:, 0, 1:], expected[:, 1:])
    assert torch.equal(rope_positions(owner, batch), got)  # the rule the rollout and both passes use
    theirs, _ = owner.get_rope_index(**{k: v for k, v in batch.items()})
    assert int(theirs[0, 0, -2]) == 3 + 2  # transformers 5 continues at the spatial side: not what vLLM does


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
def test_with_images_only_the_rule_is_the_models_own(arch, tiny_model_dir, tmp_path):
    from vlm_grpoma.answers import Box, Boxes
    from vlm_grpoma.datasets.schema import Record, ShortAnswer, with_images

    owner, adapter = _owner(tiny_model_dir, arch)
    for i, size in enumerate([(90, 70), (40, 120)]):
        Image.new("RGB", size, (60 * i, 90, 90)).save(tmp_path / f"{i}.png")
    boxes = Boxes((Box(1, 1, 9, 9),))
    two = Record("two", str(tmp_path / "0.png"), "detection", "the square", 90, 70, boxes)
    two = with_images(two, (str(tmp_path / "1.png"), str(tmp_path / "0.png")), 1)
    text = Record("text", None, "answer", "What is 2+3 plus 4?", None, None, ShortAnswer("5"))
    prompts = adapter.build_inputs([two, text])
    batch = collate(prompts, [p.input_ids.tolist() for p in prompts], [0, 1], adapter.tokens)
    theirs, _ = owner.get_rope_index(
        input_ids=batch["input_ids"],
        mm_token_type_ids=batch["mm_token_type_ids"],
        image_grid_thw=batch["image_grid_thw"],
        attention_mask=batch["attention_mask"],
    )
    assert torch.equal(video_positions(owner.config, batch), theirs)
