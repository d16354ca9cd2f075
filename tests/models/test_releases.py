"""Each Qwen-VL release kind (Qwen2-VL / Qwen2.5-VL / Qwen3-VL Instruct, Qwen3-VL Thinking), reproduced by
``release_fixtures``: its published renderings, its vocabulary, and the adapter, rewards, SFT targets,
rollout and shared-prefix pass agreeing on who opens the thought."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from release_fixtures import BY_NAME, RELEASES, Release, processor, real_tokenizer, tiny_tokenizer

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import ConfigError, ModelConfig, load_config
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.models.families import FAMILIES
from vlm_grpoma.models.prompts import task_instruction
from vlm_grpoma.models.qwen import QwenVLAdapter, generation_prompt
from vlm_grpoma.models.qwen_vocab import wheel_path
from vlm_grpoma.rewards import Completion
from vlm_grpoma.rewards.registry import build_rewards
from vlm_grpoma.trainer.sft import target_text

NAMES = [r.name for r in RELEASES]
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112
CLOSED_SYSTEM = (
    "You are a helpful assistant. First think step by step inside <think> </think>, "
    "then give the final answer as JSON inside <answer> </answer>."
)
OPENED_SYSTEM = (
    "You are a helpful assistant. Your reply starts inside an open <think>: think step by step, close the "
    "thought with </think>, then give the final answer as JSON inside <answer> </answer>."
)


def adapter_for(release: Release, tokenizer=None, **options) -> QwenVLAdapter:
    return QwenVLAdapter(
        FAMILIES[release.arch], processor(release, tokenizer), MIN_PIXELS, MAX_PIXELS, **options
    )


@pytest.fixture(scope="module")
def tiny_adapters():
    return {r.name: adapter_for(r) for r in RELEASES}


@pytest.fixture
def record(tmp_path) -> Record:
    path = tmp_path / "square.png"
    Image.new("RGB", (100, 100), (200, 40, 40)).save(path)
    # a box exact in every family's frame: 0-1000 (x10) and Qwen2.5's 112x112 resized pixels (x1.12)
    return Record(
        id="sq",
        image=str(path),
        task="detection",
        prompt="the red square",
        width=100,
        height=100,
        ground_truth=Boxes((Box(25, 25, 75, 75, "red square"),)),
    )


def needs_wheel():
    if not wheel_path().is_file():
        pytest.skip(
            f"{wheel_path()} is absent: `make setup` downloads the dashscope wheel (Qwen's BPE ranks)"
        )


# -- the published renderings -------------------------------------------------------------------------------

#: huggingface/transformers docs/source/en/model_doc/qwen2_vl.md (see release_fixtures for the commit).
DOCS_CONVERSATION = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hello, how are you?"}]},
    {
        "role": "assistant",
        "content": "I'm doing well, thank you for asking. How can I assist you today?",
    },
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Can you describe these images and video?"},
            {"type": "image"},
            {"type": "image"},
            {"type": "video"},
            {"type": "text", "text": "These are from my vacation."},
        ],
    },
    {
        "role": "assistant",
        "content": "I'd be happy to describe the images and video for you. Could you please provide more "
        "context about your vacation?",
    },
    {
        "role": "user",
        "content": "It was a trip to the mountains. Can you see the details in the images and video?",
    },
]
DOCS_WITHOUT_ID = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
    "<|image_pad|><|vision_end|>Hello, how are you?<|im_end|>\n<|im_start|>assistant\nI'm doing well, thank "
    "you for asking. How can I assist you today?<|im_end|>\n<|im_start|>user\nCan you describe these images "
    "and video?<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>"
    "<|vision_start|><|video_pad|><|vision_end|>These are from my vacation.<|im_end|>\n<|im_start|>assistant\n"
    "I'd be happy to describe the images and video for you. Could you please provide more context about your "
    "vacation?<|im_end|>\n<|im_start|>user\nIt was a trip to the mountains. Can you see the details in the "
    "images and video?<|im_end|>\n<|im_start|>assistant\n"
)
DOCS_WITH_ID = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nPicture 1: <|vision_start|>"
    "<|image_pad|><|vision_end|>Hello, how are you?<|im_end|>\n<|im_start|>assistant\nI'm doing well, thank "
    "you for asking. How can I assist you today?<|im_end|>\n<|im_start|>user\nCan you describe these images "
    "and video?Picture 2: <|vision_start|><|image_pad|><|vision_end|>Picture 3: <|vision_start|><|image_pad|>"
    "<|vision_end|>Video 1: <|vision_start|><|video_pad|><|vision_end|>These are from my vacation.<|im_end|>\n"
    "<|im_start|>assistant\nI'd be happy to describe the images and video for you. Could you please provide "
    "more context about your vacation?<|im_end|>\n<|im_start|>user\nIt was a trip to the mountains. Can you "
    "see the details in the images and video?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.mark.parametrize("name", ["Qwen2-VL-Instruct", "Qwen2.5-VL-Instruct"])
def test_qwen2_templates_render_the_documented_strings(name):
    proc = processor(BY_NAME[name])
    render = proc.apply_chat_template
    assert render(DOCS_CONVERSATION, tokenize=False, add_generation_prompt=True) == DOCS_WITHOUT_ID
    assert (
        render(DOCS_CONVERSATION, tokenize=False, add_generation_prompt=True, add_vision_id=True)
        == DOCS_WITH_ID
    )


def test_qwen3_templates_render_the_published_strings():
    """ollama's golden tests of its Qwen3-VL ports (see release_fixtures): no default system message, the
    Thinking generation prompt opens the thought, and a reply's reasoning goes in a think block (the Hugging
    Face template also closes the turn with <|im_end|>, which ollama leaves open for prefill)."""
    basic = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello, how are you?"},
    ]
    scaffold = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello, how are you?"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    instruct, thinking = processor(BY_NAME["Qwen3-VL-Instruct"]), processor(BY_NAME["Qwen3-VL-Thinking"])
    assert instruct.apply_chat_template(basic, tokenize=False, add_generation_prompt=True) == scaffold
    assert thinking.apply_chat_template(basic, tokenize=False, add_generation_prompt=True) == scaffold + (
        "<think>\n"
    )
    story = [
        {"role": "user", "content": "Tell me a story in two sentences."},
        {
            "role": "assistant",
            "content": "abc",
            "reasoning_content": "To make this story interesting, I will speak in poetry.",
        },
    ]
    assert thinking.apply_chat_template(story, tokenize=False) == (
        "<|im_start|>user\nTell me a story in two sentences.<|im_end|>\n<|im_start|>assistant\n<think>\n"
        "To make this story interesting, I will speak in poetry.\n</think>\n\nabc<|im_end|>\n"
    )
    only_user = [{"role": "user", "content": "Hi"}]
    assert instruct.apply_chat_template(only_user, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("name", NAMES)
def test_real_vocabularies_place_the_think_tags(name):
    needs_wheel()
    release = BY_NAME[name]
    tok = real_tokenizer(release)
    assert tok.encode("Hello world") == [9707, 1879]  # Qwen2's ranks in every generation
    assert (
        tok.convert_tokens_to_ids("<|image_pad|>") == 151655
        and tok.convert_tokens_to_ids("<|im_end|>") == 151645
    )
    if release.think_tags_are_tokens:
        assert len(tok) == 151669
        assert tok.encode("<think>") == [151667] and tok.encode("</think>") == [151668]
        assert tok.encode("<tool_response>") == [151665]
    else:
        assert len(tok) == (151665 if release.vocabulary == "qwen2_5" else 151657)
        assert tok.encode("</think>") == [522, 26865, 29]
    # the tags are plain tokens: kept when special tokens are skipped, as the rollout decodes its texts
    ids = tok.encode("a</think>b<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "a</think>b"


# -- who opens the thought ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_generation_prompt_and_detection(name, tiny_adapters):
    release, adapter = BY_NAME[name], tiny_adapters[name]
    expected = "<|im_start|>assistant\n" + ("<think>\n" if release.opens_thought else "")
    assert generation_prompt(adapter.processor) == expected
    assert adapter.thought.opened is release.opens_thought
    assert adapter.tokenizer.decode(list(adapter.tokens.think_close)) == (
        "\n</think>" if release.opens_thought else "</think>"
    )


@pytest.mark.parametrize("style", ["full", "compact"])
@pytest.mark.parametrize("name", NAMES)
def test_prompts_render_as_the_release_renders_them(name, style, record):
    release = BY_NAME[name]
    adapter = adapter_for(release, prompt_style=style)
    (prompt,) = adapter.build_inputs([record])
    frame = adapter.frame(record)
    instruction = task_instruction(
        record, adapter.family.frame_spec, round(frame.model_width), round(frame.model_height), style
    )
    if style == "full":
        system = OPENED_SYSTEM if release.opens_thought else CLOSED_SYSTEM
        head = f"<|im_start|>system\n{system}<|im_end|>\n"
    else:  # no system message: Qwen2/2.5 templates insert their default one, Qwen3's do not
        head = (
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" if release.default_system else ""
        )
    expected = (
        f"{head}<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{instruction}<|im_end|>\n"
        "<|im_start|>assistant\n" + ("<think>\n" if release.opens_thought else "")
    )
    assert prompt.text == expected
    # one placeholder expanded to one token per merged 2x2 patch group: 14-pixel patches for Qwen2/2.5, 16 for Qwen3
    n_image = int((prompt.input_ids == adapter.tokens.image_id).sum())
    side = 112 if release.arch != "qwen3_vl" else 96
    assert n_image == (side // (2 * adapter.family.patch_size)) ** 2 == int(prompt.image_grid_thw.prod()) // 4


def test_thinking_override_opens_or_leaves_the_thought(record):
    """``opened`` on an Instruct template renders what the Thinking template renders, ``closed`` on the
    Thinking template what the Instruct one renders; ``auto`` follows each template."""
    instruct, thinking = BY_NAME["Qwen3-VL-Instruct"], BY_NAME["Qwen3-VL-Thinking"]
    text = {
        (r.name, mode): adapter_for(r, thinking=mode).build_inputs([record])[0].text
        for r in (instruct, thinking)
        for mode in ("auto", "opened", "closed")
    }
    assert text[instruct.name, "opened"] == text[thinking.name, "auto"] == text[thinking.name, "opened"]
    assert text[thinking.name, "closed"] == text[instruct.name, "auto"] == text[instruct.name, "closed"]
    assert text[thinking.name, "auto"].endswith("<|im_start|>assistant\n<think>\n")
    assert text[instruct.name, "auto"].endswith("<|im_start|>assistant\n")
    qwen2 = adapter_for(BY_NAME["Qwen2-VL-Instruct"], thinking="opened")
    assert qwen2.thought.opened and qwen2.build_inputs([record])[0].text.endswith("assistant\n<think>\n")
    with pytest.raises(ValueError, match="thinking"):
        adapter_for(instruct, thinking="maybe")


def test_thinking_mode_is_a_validated_config_key():
    assert ModelConfig().thinking == "auto"
    assert load_config(None, ["model.thinking=opened"]).model.thinking == "opened"
    with pytest.raises(ConfigError, match="model.thinking"):
        load_config(None, ["model.thinking=maybe"])


# -- completions: rewards, parsing and SFT targets ---------------------------------------------------------


def split_completion(text: str) -> tuple[str, str]:
    """A completion as the rollout splits it: the thought up to and including ``</think>``, then the answer."""
    end = text.index("</think>") + len("</think>")
    return text[:end], text[end:]


def score(adapter, record, text, opened=None):
    rewards = build_rewards({"iou": 1.0, "format": 0.5})
    thought, answer = split_completion(text)
    opened = adapter.thought.opened if opened is None else opened
    completion = Completion(adapter.parse_answer(thought + answer, record), thought, answer, opened)
    return rewards.score([completion], [record])


def test_a_correct_completion_scores_the_same_under_every_kind(tiny_adapters, record):
    totals = {}
    for name, adapter in tiny_adapters.items():
        text = target_text(adapter, record)
        assert text.startswith("<think>") is not adapter.thought.opened
        result = score(adapter, record, text)
        totals[name] = result.total[0]
        assert result.components["format"] == [1.0] and result.components["iou"] == [1.0], (name, text)
    assert set(totals.values()) == {1.5}, totals


def test_who_writes_the_opening_tag_decides_the_format(tiny_adapters, record):
    """The completion a closed-thought release writes is malformed where the prompt opened the thought (a
    second <think>), and vice versa; the answer itself parses either way."""
    closed, opened = tiny_adapters["Qwen3-VL-Instruct"], tiny_adapters["Qwen3-VL-Thinking"]
    closed_text, opened_text = target_text(closed, record), target_text(opened, record)
    for text, kind in ((closed_text, True), (opened_text, False)):
        result = score(closed, record, text, opened=kind)
        assert result.components["format"] == [0.0] and result.components["iou"] == [1.0]
        assert result.failures == {"format/bad_structure": 1}


@pytest.mark.parametrize("name", NAMES)
def test_sft_targets_are_what_the_release_renders_as_its_reply(name, record):
    """The template's own rendering of [system, user, reply] is our prompt followed by exactly the SFT
    target: the Thinking template moves the reasoning into its think block the way our target writes it."""
    release = BY_NAME[name]
    adapter = adapter_for(release)
    target = target_text(adapter, record)
    messages = adapter.messages(record)
    rendered = adapter.processor.apply_chat_template(
        [*messages, {"role": "assistant", "content": [{"type": "text", "text": target}]}], tokenize=False
    )
    (prompt,) = adapter.build_inputs([record])
    assert rendered == prompt.text + target + "<|im_end|>\n"


@pytest.mark.parametrize("name", NAMES)
def test_sft_targets_tokenize_as_the_release_generates_them(name, record):
    """With the real vocabulary: the target's tokens continue the prompt's tokens unchanged (no merge across
    the boundary), and a Thinking target has no <think> token but one </think> token."""
    needs_wheel()
    release = BY_NAME[name]
    adapter = adapter_for(release, real_tokenizer(release))
    tok = adapter.tokenizer
    target = target_text(adapter, record)
    (prompt,) = adapter.build_inputs([record])
    prompt_ids = tok(prompt.text, add_special_tokens=False).input_ids
    target_ids = tok(target, add_special_tokens=False).input_ids
    assert tok(prompt.text + target, add_special_tokens=False).input_ids == prompt_ids + target_ids
    if release.think_tags_are_tokens:
        assert target_ids.count(151668) == 1
        assert (151667 in target_ids) is not release.opens_thought
        assert (prompt_ids[-2:] == [151667, 198]) is release.opens_thought  # "<think>", "\n"
    assert tok.decode(target_ids) == target


# -- rollouts and the shared-prefix pass --------------------------------------------------------------------


@pytest.fixture(scope="module")
def release_models(tmp_path_factory):
    """A tiny random model per release, with the release's vocabulary and template (built on first use)."""
    from vlm_grpoma.models.loading import load_model
    from vlm_grpoma.models.tiny import build_tiny_model

    built = {}

    def get(name):
        if name not in built:
            release = BY_NAME[name]
            out = tmp_path_factory.mktemp(name)
            build_tiny_model(release.arch, out, tokenizer=tiny_tokenizer(release))
            loaded = load_model(
                ModelConfig(
                    name_or_path=str(out), dtype="float32", min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS
                )
            )
            built[name] = (loaded.model.eval(), loaded.adapter)
        return built[name]

    return get


def scripted(model, script):
    """Make the model write ``script`` token by token (then anything): a bias on the LM head per step."""
    calls = {"n": 0}

    def hook(module, inputs, output):
        step, calls["n"] = calls["n"], calls["n"] + 1
        if step < len(script):
            output = output.clone()
            output[..., script[step]] += 100.0
        return output

    return model.lm_head.register_forward_hook(hook)


@pytest.mark.parametrize("name", NAMES)
def test_hf_rollout_stops_where_the_release_closes_the_thought(name, release_models, record):
    from vlm_grpoma.rollout.hf import HFRolloutEngine
    from vlm_grpoma.rollout.vllm import first_stop
    from vlm_grpoma.sampling import SamplingParams
    from vlm_grpoma.trainer.logprobs import path_log_probs
    from vlm_grpoma.trainer.packed import shared_prefix_log_probs
    from vlm_grpoma.trainer.scoring import score_tree

    torch.manual_seed(0)
    model, adapter = release_models(name)
    text = target_text(adapter, record)
    script = adapter.tokenizer.encode(text, add_special_tokens=False)
    prompts = adapter.build_inputs([record])
    params = SamplingParams(
        num_thoughts=1, answers_per_thought=1, temperature=0.0, max_thought_tokens=40, max_answer_tokens=60
    )
    handle = scripted(model, script)
    try:
        tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    finally:
        handle.remove()
    # the thought ends with the token that completes </think> (a vocabulary may merge it with what follows)
    end = first_stop(script, "</think>", adapter.tokenizer.decode)
    thought = adapter.tokenizer.decode(script[:end])
    assert thought.endswith(("</think>", "</think><")) and thought.count("</think>") == 1
    assert tree.thought_finish == [["stop"]] and tree.answer_finish == [[["stop"]]]
    assert tree.thought_texts[0][0] == thought and thought + tree.answer_texts[0][0][0] == text
    assert torch.equal(
        torch.cat([tree.thought_tokens(0, 0), tree.answer_tokens(0, 0, 0)]), torch.tensor(script)
    )
    scored = score_tree(tree, [record], adapter, build_rewards({"iou": 1.0, "format": 0.5}))
    assert bool(scored.parsed.all()) and scored.rewards.tolist() == [[[1.5]]], scored.result.failures
    # the packed pass scores this thought and answer as the naive one does
    naive, packed = (
        path_log_probs(model, tree, [0], adapter.tokens),
        shared_prefix_log_probs(model, tree, [0], adapter.tokens),
    )
    assert torch.allclose(naive.thought, packed.thought, atol=1e-5)
    assert torch.allclose(naive.answer, packed.answer, atol=1e-5)
    # the grounding evaluation reads the same completion as well formed
    from vlm_grpoma.eval.grounding import generate_predictions
    from vlm_grpoma.eval.grounding_metrics import score_predictions

    handle = scripted(model, script)
    try:
        predictions = generate_predictions(model, adapter, [record], params)
    finally:
        handle.remove()
    report = score_predictions(predictions)
    assert report.tasks["detection"].format_rate == 1.0 and report.tasks["detection"].parse_rate == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_truncated_thoughts_are_closed_as_the_release_closes_them(name, release_models, record):
    from vlm_grpoma.rollout.hf import HFRolloutEngine
    from vlm_grpoma.rollout.vllm import RequestBuilder
    from vlm_grpoma.sampling import SamplingParams

    model, adapter = release_models(name)
    prompts = adapter.build_inputs([record])
    params = SamplingParams(num_thoughts=2, answers_per_thought=1, max_thought_tokens=3, max_answer_tokens=2)
    with torch.no_grad():
        tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    close = "\n</think>" if adapter.thought.opened else "</think>"
    cut = [k for k in range(2) if tree.thought_finish[0][k] == "length"]
    assert cut  # a random model rarely writes the tag within 3 tokens
    for k in cut:
        assert tree.thought_texts[0][k].endswith(close)
        assert tree.thought_tokens(0, k)[-len(adapter.tokens.think_close) :].tolist() == list(
            adapter.tokens.think_close
        )
    # the vLLM requests stop on the same tag and close with the same tokens
    builder = RequestBuilder.for_adapter(adapter)
    (request,) = builder.thoughts(prompts, [0], params)
    assert request.sampling["stop"] == ["</think>"]
    (closing,) = builder.closings(prompts, [[5, 6]], [0])
    assert closing.prompt_token_ids[-len(adapter.tokens.think_close) - 2 :] == [
        5,
        6,
        *adapter.tokens.think_close,
    ]
