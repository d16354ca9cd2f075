"""Several images per prompt, every family: the prompt the adapter builds (each image in order, its own
grid and tokens, the coordinates in the target image), the log-probs the HF rollout records equal the
trainer's naive and shared-prefix passes (values and gradients), the second image is really seen, and the
vLLM requests carry the same images in the same order."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from PIL import Image

from tests.trainer.pass_agreement import assert_recorded_equals_naive, assert_shared_equals_naive
from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.errors import DataError
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.models.record_checks import screen_records
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.vllm.requests import RequestBuilder
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.logprobs import path_log_probs

FRONT, WRIST = (90, 70), (64, 120)  # the target view, and a second view of another size and aspect


def _records(folder, wrist_colour=(10, 10, 200)) -> list[Record]:
    """A two-view record (wrist first, target front second), a one-image record, a text-only record."""
    Image.new("RGB", FRONT, (200, 30, 30)).save(folder / "front.png")
    Image.new("RGB", WRIST, wrist_colour).save(folder / f"wrist-{wrist_colour[2]}.png")
    front, wrist = str(folder / "front.png"), str(folder / f"wrist-{wrist_colour[2]}.png")
    boxes = Boxes((Box(1, 1, 9, 9),))
    return [
        Record("two", front, "detection", "the square", *FRONT, boxes, images=(wrist, front), target_image=1),
        Record("one", front, "detection", "the square on the left", *FRONT, boxes),
        Record("text", None, "answer", "What is 2+3?", None, None, ShortAnswer("5")),
    ]


def _load(tiny_model_dir, arch, max_images=2):
    loaded = load_model(
        ModelConfig(
            name_or_path=str(tiny_model_dir(arch)),
            dtype="float32",
            max_pixels=112 * 112,
            max_images=max_images,
        )
    )
    return loaded.model.eval(), loaded.adapter


def test_each_image_gets_its_own_grid_and_tokens_in_order(arch, tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    _, adapter = _load(tiny_model_dir, arch)
    two, one, _ = _records(tmp_path)
    wrist_only = replace(one, id="wrist", image=two.images[0], width=WRIST[0], height=WRIST[1])
    pair, front_alone, wrist_alone = adapter.build_inputs([two, one, wrist_only])
    patch, merge = adapter.family.patch_size, adapter.family.factor // adapter.family.patch_size
    grids = []
    for size in (WRIST, FRONT):
        width, height = adapter.resized_size(*size)
        grids.append([1, height // patch, width // patch])
    assert pair.image_grid_thw.tolist() == grids
    assert [image.size for image in pair.images] == [adapter.resized_size(*s) for s in (WRIST, FRONT)]
    # the patches are each image's own, in prompt order: the wrist's then the front's
    torch.testing.assert_close(
        pair.pixel_values, torch.cat([wrist_alone.pixel_values, front_alone.pixel_values]), rtol=0, atol=0
    )
    runs = _image_runs(pair.input_ids.tolist(), adapter.tokens.image_id)
    assert runs == [t * h * w // merge**2 for t, h, w in grids]
    assert "Picture 1: <|vision_start|>" in pair.text and "Picture 2: <|vision_start|>" in pair.text
    assert "Coordinates are in Picture 2." in pair.text and "Picture" not in front_alone.text
    assert pair.frame == front_alone.frame  # the answers are in the target image's frame alone


def _image_runs(ids: list[int], image_id: int) -> list[int]:
    runs, count = [], 0
    for token in [*ids, -1]:
        if token == image_id:
            count += 1
        elif count:
            runs.append(count)
            count = 0
    return runs


def test_rollout_logprobs_equal_the_naive_and_shared_passes(arch, tiny_model_dir, tmp_path):
    """A two-image, a one-image and a text-only prompt in one batch: the log-probs the HF rollout records are
    the naive pass's, the shared-prefix pass equals the naive one in values and gradients, and the wrist view
    (not the target) changes what the model computes."""
    torch.set_num_threads(1)
    model, adapter = _load(tiny_model_dir, arch)
    prompts = adapter.build_inputs(_records(tmp_path))
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=6, max_answer_tokens=4, seed=2
    )
    tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    naive = assert_recorded_equals_naive(model, tree, adapter.tokens)
    with torch.no_grad():
        alone = path_log_probs(model, tree, [0], adapter.tokens)
    torch.testing.assert_close(alone.answer[0], naive.answer[0], atol=1e-5, rtol=0)

    assert_shared_equals_naive(model, tree, [2, 0, 1], adapter.tokens)

    other_wrist = adapter.build_inputs(_records(tmp_path, wrist_colour=(250, 250, 20)))
    with torch.no_grad():
        seen = path_log_probs(model, replace(tree, prompts=other_wrist), [0], adapter.tokens)
        mine = path_log_probs(model, tree, [0], adapter.tokens)
    assert (seen.thought - mine.thought).abs().max() > 1e-4  # the second image reaches the model


def test_vllm_requests_carry_every_image_in_prompt_order(tiny_model_dir, tmp_path):
    _, adapter = _load(tiny_model_dir, "qwen2_5_vl")
    prompts = adapter.build_inputs(_records(tmp_path))
    params = SamplingParams(num_thoughts=2, answers_per_thought=1, max_thought_tokens=6, max_answer_tokens=4)
    two, one, text = RequestBuilder.for_adapter(adapter).thoughts(prompts, [1, 2, 3], params)
    images = two.prompt()["multi_modal_data"]["image"]
    assert isinstance(images, list) and [i is p for i, p in zip(images, prompts[0].images)] == [True, True]
    assert two.prompt_token_ids.count(adapter.tokens.image_id) == 2  # one placeholder per image, unexpanded
    assert one.prompt()["multi_modal_data"]["image"] is prompts[1].images[0]
    assert "multi_modal_data" not in text.prompt()


def test_more_images_than_model_max_images_is_one_line_naming_the_record(tiny_model_dir, tmp_path):
    _, adapter = _load(tiny_model_dir, "qwen2_vl", max_images=1)
    records = _records(tmp_path)
    with pytest.raises(DataError, match=r"^train.jsonl \(id two\): 2 images, more than model.max_images=1"):
        screen_records(records, adapter, 0, source="train.jsonl", skip_bad=False)
    assert [r.id for r in screen_records(records, adapter, 0, source="t", skip_bad=True)] == ["one", "text"]
    with pytest.raises(ValueError, match="record two: 2 images, more than model.max_images=1"):
        adapter.build_inputs(records[:1])


def test_the_prompt_budget_counts_every_images_tokens(tiny_model_dir, tmp_path):
    _, adapter = _load(tiny_model_dir, "qwen2_vl")
    two, _, _ = _records(tmp_path)
    (pair,) = adapter.build_inputs([two])
    length, image_tokens = len(pair.input_ids), int((pair.input_ids == adapter.tokens.image_id).sum())
    assert screen_records([two], adapter, length, source="t", skip_bad=False) == [two]  # exact, not estimated
    expected = (
        rf"prompt is {length} tokens \({image_tokens} of them the 2 images'\), more than .*={length - 1}"
    )
    with pytest.raises(DataError, match=expected):
        screen_records([two], adapter, length - 1, source="t", skip_bad=False)
