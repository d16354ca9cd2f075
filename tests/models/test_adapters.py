"""Adapters: registry, prompts, processor inputs, coordinate frames and answer round trips per family."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from PIL import Image

from vlm_grpoma.answers import Box, Boxes, ContactAction, ParseError, Points, Trajectory
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.images import ImageLoadError
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.models.registry import SUPPORTED_MODEL_TYPES, UnsupportedModelError, load_adapter

MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112


def reference_smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int):
    """Qwen's documented resize rule, written out independently: round sides to the factor, then rescale
    into [min_pixels, max_pixels] keeping the aspect ratio."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def make_record(tmp_path, width=100, height=80, task="detection", rid="r0", colour=(200, 30, 30)) -> Record:
    path = tmp_path / f"{rid}.png"
    Image.new("RGB", (width, height), colour).save(path)
    gt = Boxes((Box(10, 12, 40, 50, "red square"),))
    return Record(
        id=rid,
        image=str(path),
        task=task,
        prompt="the red square",
        width=width,
        height=height,
        ground_truth=gt,
    )


@pytest.fixture
def adapter(arch, tiny_model_dir):
    return load_adapter(
        ModelConfig(name_or_path=str(tiny_model_dir(arch)), min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    )


def test_unsupported_model_type_is_named(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError) as err:
        load_adapter(ModelConfig(name_or_path=str(tmp_path)))
    message = str(err.value)
    assert "'gpt2'" in message and str(tmp_path) in message
    assert all(t in message for t in SUPPORTED_MODEL_TYPES)


def test_corrupt_image_names_record_and_file(adapter, tmp_path):
    record = make_record(tmp_path)
    with open(record.image, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n not really a png")
    with pytest.raises(ImageLoadError) as err:
        adapter.build_inputs([record])
    assert "r0" in str(err.value) and record.image in str(err.value)


def test_image_size_mismatch_is_named(adapter, tmp_path):
    record = make_record(tmp_path)
    with pytest.raises(ValueError, match="r0"):
        adapter.build_inputs([record], images=[[Image.new("RGB", (50, 50))]])


def test_messages_state_the_format_and_the_frame(adapter, tmp_path):
    record = make_record(tmp_path, 100, 80)
    system, user = adapter.messages(record)
    assert "<think>" in system["content"][0]["text"] and "<answer>" in system["content"][0]["text"]
    image, text = user["content"]
    assert (
        image["type"] == "image" and image["min_pixels"] == MIN_PIXELS and image["max_pixels"] == MAX_PIXELS
    )
    assert "the red square" in text["text"] and "bbox_2d" in text["text"]
    if adapter.model_type == "qwen2_5_vl":
        assert "(112x84)" in text["text"]  # the resized image's pixels
    else:
        assert "0 to 1000" in text["text"]


@pytest.mark.parametrize(
    "task,key", [("affordance", "point_2d"), ("trajectory", "[[x, y]"), ("manipulation", '"forward"')]
)
def test_task_instructions(tiny_model_dir, tmp_path, task, key):
    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_vl"))))
    record = make_record(tmp_path, task=task)
    assert key in adapter.messages(record)[1]["content"][1]["text"]


@pytest.mark.parametrize("size", [(100, 80), (37, 300), (640, 480)])
def test_inputs_match_the_reference_resize(adapter, tmp_path, size):
    record = make_record(tmp_path, *size)
    (prompt,) = adapter.build_inputs([record])
    factor = adapter.family.factor
    h, w = reference_smart_resize(size[1], size[0], factor, MIN_PIXELS, MAX_PIXELS)
    assert prompt.images[0].size == (w, h) == adapter.resized_size(*size)
    patch = adapter.family.patch_size
    assert prompt.image_grid_thw.tolist() == [[1, h // patch, w // patch]]
    n_tokens = int((prompt.input_ids == adapter.tokens.image_id).sum())
    assert n_tokens == (h // factor) * (w // factor)
    assert prompt.pixel_values.shape[0] == (h // patch) * (w // patch)
    assert prompt.text == adapter.processor.tokenizer.decode(prompt.input_ids).replace(
        "<|image_pad|>" * n_tokens, "<|image_pad|>"
    )
    expected_model = (w, h) if adapter.model_type == "qwen2_5_vl" else (1000, 1000)
    assert (prompt.frame.model_width, prompt.frame.model_height) == expected_model


@pytest.mark.parametrize("size", [(100, 80), (37, 300), (640, 480), (1001, 999)])
def test_coordinate_round_trip_within_half_a_model_pixel(adapter, tmp_path, size):
    width, height = size
    record = make_record(tmp_path, width, height)
    frame = adapter.frame(record)
    tol_x, tol_y = 0.5 * width / frame.model_width + 1e-9, 0.5 * height / frame.model_height + 1e-9
    g = torch.Generator().manual_seed(sum(size))
    for _ in range(20):
        x1, y1, dx, dy = torch.rand(4, generator=g).tolist()
        x1, y1 = x1 * 0.7 * width, y1 * 0.7 * height
        answer = Boxes(
            (Box(x1, y1, x1 + (0.1 + 0.2 * dx) * width, y1 + (0.1 + 0.2 * dy) * height, "red square"),)
        )
        text = f"<think>ok</think><answer>{adapter.format_answer(answer, record)}</answer>"
        parsed = adapter.parse_answer(text, record)
        assert isinstance(parsed, Boxes), parsed
        got, want = parsed.boxes[0], answer.boxes[0]
        assert abs(got.x1 - want.x1) <= tol_x and abs(got.x2 - want.x2) <= tol_x
        assert abs(got.y1 - want.y1) <= tol_y and abs(got.y2 - want.y2) <= tol_y
        assert got.label == "red square"
    if adapter.model_type == "qwen2_5_vl" and frame.model_width >= width and frame.model_height >= height:
        assert max(tol_x, tol_y) <= 0.5 + 1e-9  # exact to one pixel when the image is not shrunk


def test_qwen25_answers_are_resized_pixels(tiny_model_dir, tmp_path):
    adapter = load_adapter(
        ModelConfig(
            name_or_path=str(tiny_model_dir("qwen2_5_vl")), min_pixels=MIN_PIXELS, max_pixels=280 * 140
        )
    )
    record = make_record(tmp_path, 560, 280)  # shrinks to 280x140 (0.5x)
    assert adapter.resized_size(560, 280) == (280, 140)
    text = adapter.format_answer(Boxes((Box(100, 50, 200, 100),)), record)
    assert text == '[{"bbox_2d": [50, 25, 100, 50]}]'
    parsed = adapter.parse_answer(f"<answer>{text}</answer>", record)
    assert parsed == Boxes((Box(100, 50, 200, 100),))


def test_normalised_frame_for_qwen2_and_qwen3(tiny_model_dir, tmp_path):
    for arch in ("qwen2_vl", "qwen3_vl"):
        adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir(arch))))
        record = make_record(tmp_path, 200, 100)
        assert adapter.format_answer(Points(((50, 25),)), record) == '[{"point_2d": [250, 250]}]'
        assert adapter.parse_answer(
            '<answer>[{"point_2d": [500, 1000]}]</answer>', make_record(tmp_path, 200, 100, task="affordance")
        ) == Points(((100, 100),))


def test_other_kinds_round_trip(adapter, tmp_path):
    traj = make_record(tmp_path, 300, 200, task="trajectory", rid="t")
    answer = Trajectory(((0.0, 0.0), (150.0, 100.0), (300.0, 200.0)))
    frame = adapter.frame(traj)
    tol = 0.5 * max(300 / frame.model_width, 200 / frame.model_height) + 1e-9
    back = adapter.parse_answer(adapter.format_answer(answer, traj), traj)
    assert isinstance(back, Trajectory) and len(back.points) == 3
    assert all(abs(a - b) <= tol for p, q in zip(back.points, answer.points) for a, b in zip(p, q))
    manip = make_record(tmp_path, 300, 200, task="manipulation", rid="m")
    action = ContactAction((30.0, 20.0), (0.0, 0.0, 1.0), (0.6, 0.8, 0.0))
    back = adapter.parse_answer(adapter.format_answer(action, manip), manip)
    assert isinstance(back, ContactAction)
    assert abs(back.point[0] - 30) <= tol and abs(back.point[1] - 20) <= tol
    # directions are not image coordinates: not scaled, only written to 3 decimals (re-normalised on parsing)
    assert back.up == pytest.approx(action.up) and back.forward == pytest.approx(action.forward)
    odd = ContactAction(
        (30.0, 20.0),
        (0.6182093644147664, 0.2691579050014417, 0.738492521238452),
        (-0.7667900963960164, 0.0, 0.6418979265186856),
    )
    text = adapter.format_answer(odd, manip)
    assert '"up": [0.618, 0.269, 0.738]' in text and '"forward": [-0.767, 0.0, 0.642]' in text
    back = adapter.parse_answer(text, manip)
    assert back.up == pytest.approx(odd.up, abs=1e-3) and back.forward == pytest.approx(odd.forward, abs=1e-3)


def test_malformed_answers_are_parse_errors(adapter, tmp_path):
    record = make_record(tmp_path)
    frame = adapter.frame(record)
    for text in [
        "",
        "no tags",
        "<answer>[{</answer>",
        '<answer>{"bbox": 1}</answer>',
        "<answer>NaN</answer>",
        f'<answer>[{{"bbox_2d": [0, 0, {frame.model_width * 3:.0f}, 5]}}]</answer>',
    ]:
        assert isinstance(adapter.parse_answer(text, record), ParseError), text


def test_special_tokens(adapter):
    tok = adapter.processor.tokenizer
    assert tok.padding_side == "left"
    names = {tok.convert_ids_to_tokens(i) for i in adapter.tokens.suppress_ids}
    assert names == {"<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"}
    assert tok.decode(list(adapter.tokens.think_close)) == "</think>"
    assert tok.convert_tokens_to_ids("<|im_end|>") in adapter.tokens.eos_ids


def test_load_model_uses_dtype_and_attention_from_config(tiny_model_dir):
    loaded = load_model(
        ModelConfig(
            name_or_path=str(tiny_model_dir("qwen2_5_vl")), dtype="bfloat16", attn_implementation="eager"
        )
    )
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.model.config._attn_implementation == "eager"
    assert loaded.adapter.model_type == "qwen2_5_vl"


@pytest.mark.parametrize(
    "prompt,lead",
    [
        ("the red square", "Find the red square. Answer"),
        ("Find the red square.", "Find the red square. Answer"),
        ("Which shape is red?", "Which shape is red? Answer"),
    ],
)
def test_sentences_are_kept_and_expressions_get_the_task_lead(tiny_model_dir, tmp_path, prompt, lead):
    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_vl"))))
    record = replace(make_record(tmp_path), prompt=prompt)
    assert adapter.messages(record)[1]["content"][1]["text"].startswith(lead)


def test_compact_prompt_style_is_short_and_keeps_the_frame(tiny_model_dir, tmp_path):
    path = str(tiny_model_dir("qwen2_5_vl"))
    full = load_adapter(ModelConfig(name_or_path=path))
    compact = load_adapter(ModelConfig(name_or_path=path, prompt_style="compact"))
    record = make_record(tmp_path)
    messages = compact.messages(record)
    assert [m["role"] for m in messages] == ["user"]
    assert (
        messages[0]["content"][1]["text"]
        == "Find the red square. Think, then answer JSON boxes (112x84 pixels)."
    )
    (short,), (long,) = compact.build_inputs([record]), full.build_inputs([record])
    assert len(short.input_ids) * 2 < len(long.input_ids)
