"""The transformers two-phase rollout on every Qwen-VL family, checked against independent references:
the model's own full forward (log-probs, mRoPE positions), recomputing the prefix instead of reusing its
cache, and decoding each prompt alone instead of in a left-padded batch."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from PIL import Image
from tree_segments import answer_segments  # tests/rollout/tree_segments.py

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.models.base import collate
from vlm_grpoma.models.families import ARCHS
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.sampling import SamplingParams


@pytest.fixture(scope="module", params=ARCHS)
def setup(request, tiny_model_dir, tmp_path_factory):
    torch.set_num_threads(1)
    loaded = load_model(
        ModelConfig(name_or_path=str(tiny_model_dir(request.param)), dtype="float32", max_pixels=112 * 112)
    )
    loaded.model.eval()
    folder = tmp_path_factory.mktemp(f"images-{request.param}")
    records = []
    for i, (w, h) in enumerate([(100, 80), (40, 150)]):  # different prompt lengths: exercises left padding
        path = folder / f"{i}.png"
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
    prompts = loaded.adapter.build_inputs(records)
    assert prompts[0].input_ids.shape != prompts[1].input_ids.shape
    return loaded.model, loaded.adapter, prompts


@contextmanager
def logit_bias(model, bias: dict[int, float]):
    """Shift some output logits (a forward hook on the LM head), e.g. to make stop tags likely."""
    vec = torch.zeros(model.lm_head.out_features)
    for token, value in bias.items():
        vec[token] = value
    handle = model.lm_head.register_forward_hook(lambda module, inputs, output: output + vec)
    try:
        yield
    finally:
        handle.remove()


def tag_bias(adapter, value: float) -> dict[int, float]:
    return {adapter.tokens.think_close[-1]: value, adapter.tokens.answer_close[-1]: value}


def check_tree_structure(tree, adapter, params) -> None:
    """Shapes, tags, finish reasons and padding of a 2-prompt, 3-thought, 2-answer tree."""
    close = torch.tensor(adapter.tokens.think_close)
    lt = params.max_thought_tokens + len(close)
    assert tree.shape == (2, 3, 2)
    assert tree.thought_ids.shape == tree.thought_mask.shape == tree.thought_logprobs.shape == (2, 3, lt)
    assert tree.answer_ids.shape == tree.answer_mask.shape == (2, 3, 2, params.max_answer_tokens)
    assert len(tree.thought_texts) == 2 and all(len(row) == 3 for row in tree.thought_texts)
    assert all(len(a) == 2 for row in tree.answer_texts for a in row)
    for b in range(2):
        for k in range(3):
            ids = tree.thought_tokens(b, k)
            assert torch.equal(ids[-len(close) :], close)  # every thought ends with </think>
            assert tree.thought_texts[b][k].endswith("</think>")
            assert tree.thought_texts[b][k].count("</think>") == 1
            assert bool(tree.thought_truncated[b, k]) == (tree.thought_finish[b][k] == "length")
            for m in range(2):
                n = int(tree.answer_lengths[b, k, m])
                text = tree.answer_texts[b][k][m]
                if tree.answer_finish[b][k][m] == "stop":
                    assert (
                        text.endswith("</answer>")
                        or tree.answer_ids[b, k, m, n - 1] in adapter.tokens.eos_ids
                    )
                else:
                    assert n == params.max_answer_tokens and "</answer>" not in text
    # the mask is a prefix: padding only after the real tokens
    lengths = tree.thought_mask.sum(-1, keepdim=True)
    assert torch.equal(tree.thought_mask, torch.arange(lt) < lengths)
    assert (tree.thought_ids[~tree.thought_mask] == tree.pad_id).all()


def test_tree_shapes_and_structure(setup):
    """Both thought endings (</think> sampled, length budget hit) are checked: seeds are tried until a tree holds
    both, since which one a random tiny model draws depends on its (generated) vocabulary."""
    model, adapter, prompts = setup
    finishes: set[str] = set()
    for seed in range(1, 9):
        params = SamplingParams(
            num_thoughts=3, answers_per_thought=2, max_thought_tokens=10, max_answer_tokens=5, seed=seed
        )
        with logit_bias(model, tag_bias(adapter, 5.0)):
            tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
        check_tree_structure(tree, adapter, params)
        finishes |= {f for row in tree.thought_finish for f in row}
        if {"stop", "length"} <= finishes:
            break
    assert {"stop", "length"} <= finishes


def test_greedy_answers_with_reused_cache_equal_recomputed(setup):
    """Phase 2 from the expanded prompt+thought cache == phase 2 recomputing prompt+thought from scratch."""
    model, adapter, prompts = setup
    params = SamplingParams(
        num_thoughts=4,
        answers_per_thought=3,
        max_thought_tokens=12,
        max_answer_tokens=8,
        seed=5,
        temperature=1.0,
        answer_temperature=0.0,
    )
    with logit_bias(model, tag_bias(adapter, 4.0)):
        reused = HFRolloutEngine.for_adapter(model, adapter, reuse_prefix_cache=True).sample(prompts, params)
        recomputed = HFRolloutEngine.for_adapter(model, adapter, reuse_prefix_cache=False).sample(
            prompts, params
        )
    finishes = {f for row in reused.thought_finish for f in row}
    assert finishes == {"stop", "length"}  # thoughts of different lengths: masked gaps in the reused cache
    assert torch.equal(reused.thought_ids, recomputed.thought_ids)
    assert torch.equal(reused.answer_ids, recomputed.answer_ids)
    assert reused.answer_finish == recomputed.answer_finish
    torch.testing.assert_close(reused.answer_logprobs, recomputed.answer_logprobs, atol=1e-4, rtol=0)
    # greedy answers of one thought are identical copies
    assert (reused.answer_ids == reused.answer_ids[:, :, :1]).all()


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 1.0},
        # away from temperature 1 and with top-k/top-p filters the raw and the warped distributions differ:
        # the recorded log-probs must be the RAW ones (the rollout-tree contract)
        {"temperature": 0.5, "top_k": 20, "top_p": 0.9, "ignore_stop": True},
        {"temperature": 1.5, "answer_temperature": 0.5, "ignore_stop": True},
    ],
)
def test_sampled_logprobs_equal_teacher_forced_forward(setup, sampling):
    """Log-probs recorded while sampling == log-softmax of one full forward of the sequence (unscaled,
    unfiltered), whose mRoPE positions the model computes itself."""
    model, adapter, prompts = setup
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=9, max_answer_tokens=6, seed=2, **sampling
    )
    with logit_bias(model, tag_bias(adapter, 3.0)):
        tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
        rows, owners, spans = [], [], []
        for seg in answer_segments(tree):
            thought = tree.thought_tokens(seg.prompt_index, seg.thought_index)
            rows.append(torch.cat([seg.context, seg.tokens]).tolist())
            owners.append(seg.prompt_index)
            n_prompt = len(prompts[seg.prompt_index].input_ids)
            spans.append((n_prompt, thought, seg))
        batch = collate(prompts, rows, owners, adapter.tokens)
        with torch.no_grad():
            logp = model(**batch).logits.float().log_softmax(-1)
    width = batch["input_ids"].shape[1]
    for i, (n_prompt, thought, seg) in enumerate(spans):
        start = width - len(rows[i]) + n_prompt  # first thought token (left padding)
        targets = torch.cat([thought, seg.tokens])
        ref = logp[i, start - 1 : start - 1 + len(targets)].gather(-1, targets[:, None]).squeeze(1)
        got = torch.cat(
            [tree.thought_logprobs[seg.prompt_index, seg.thought_index][: len(thought)], seg.logprobs]
        )
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_sampling_follows_the_tempered_distribution(setup, temperature):
    """Tokens are drawn from softmax(logits / T): two tokens made likely by a bias are sampled in the odds
    (p_a / p_b) ** (1 / T), where p are the raw probabilities the rollout records (checked at T != 1, where
    sampling from the raw distribution would give p_a / p_b instead)."""
    model, adapter, prompts = setup
    a, b = 100, 101
    params = SamplingParams(
        num_thoughts=800,
        answers_per_thought=1,
        max_thought_tokens=1,
        max_answer_tokens=1,
        temperature=temperature,
        ignore_stop=True,
        seed=5,
    )
    with logit_bias(model, {a: 30.0, b: 29.0}):  # a and b hold nearly all the mass; raw odds near e
        tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts[:1], params)
    first, logp = tree.thought_ids[0, :, 0], tree.thought_logprobs[0, :, 0]
    n_a, n_b = int((first == a).sum()), int((first == b).sum())
    assert n_a + n_b >= 790
    raw_odds = float((logp[first == a][0] - logp[first == b][0]).exp())
    expected = raw_odds ** (1 / temperature)
    # binomial noise of the observed odds at these counts is ~10 %; sampling untempered would be off by x e^(±1)
    assert n_a / n_b == pytest.approx(expected, rel=0.3), (n_a, n_b, raw_odds)


def test_batched_prompts_equal_prompts_alone(setup):
    model, adapter, prompts = setup
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=8, max_answer_tokens=4, temperature=0.0
    )
    engine = HFRolloutEngine.for_adapter(model, adapter)
    with logit_bias(model, tag_bias(adapter, 2.0)):
        both = engine.sample(prompts, params)
        for b, prompt in enumerate(prompts):
            alone = engine.sample([prompt], params)
            assert torch.equal(alone.thought_ids[0], both.thought_ids[b])
            assert torch.equal(alone.answer_ids[0], both.answer_ids[b])
            torch.testing.assert_close(alone.thought_logprobs[0], both.thought_logprobs[b], atol=1e-4, rtol=0)


def test_truncated_thoughts_are_closed_and_flagged(setup):
    model, adapter, prompts = setup
    close = list(adapter.tokens.think_close)
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=1, max_thought_tokens=6, max_answer_tokens=3, seed=3
    )
    with logit_bias(model, {close[-1]: -1e4}):  # the thought can never stop by itself
        tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    assert tree.thought_truncated.all()
    assert (tree.thought_lengths == params.max_thought_tokens + len(close)).all()
    assert (tree.thought_ids[..., -len(close) :] == torch.tensor(close)).all()
    # the forced tokens' log-probs are the model's (here: the -1e4 bias makes them very unlikely)
    assert (tree.thought_logprobs[..., -1] < -1000).all()
    assert (tree.thought_logprobs[..., : params.max_thought_tokens] > -100).all()


def test_vision_tokens_are_never_sampled(setup):
    model, adapter, prompts = setup
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=8, max_answer_tokens=6, seed=4
    )
    with logit_bias(model, dict.fromkeys(adapter.tokens.suppress_ids, 30.0)):  # the model now prefers them
        tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    sampled = torch.cat([tree.thought_ids[tree.thought_mask], tree.answer_ids[tree.answer_mask]])
    assert not torch.isin(sampled, torch.tensor(adapter.tokens.suppress_ids)).any()
    # the recorded log-probs show the vision tokens held nearly all the mass that was refused
    assert tree.thought_logprobs[tree.thought_mask].max() < -20
    for text in (t for row in tree.thought_texts for t in row):
        assert "<|image_pad|>" not in text and "<|vision_start|>" not in text


def test_same_seed_same_tree_other_seed_differs(setup):
    model, adapter, prompts = setup
    engine = HFRolloutEngine.for_adapter(model, adapter)
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=6, max_answer_tokens=4, seed=7
    )
    a, b = engine.sample(prompts, params), engine.sample(prompts, params)
    c = engine.sample(prompts, SamplingParams(**{**params.__dict__, "seed": 8}))
    assert torch.equal(a.thought_ids, b.thought_ids) and torch.equal(a.answer_ids, b.answer_ids)
    assert not torch.equal(a.thought_ids, c.thought_ids)


def test_ignore_stop_runs_every_sequence_to_its_budget(setup):
    model, adapter, prompts = setup
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=5, max_answer_tokens=3, ignore_stop=True
    )
    with logit_bias(model, tag_bias(adapter, 50.0)):  # would stop at once otherwise
        tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    assert (tree.thought_lengths == 5 + len(adapter.tokens.think_close)).all()
    assert (tree.answer_lengths == 3).all()


def test_train_mode_is_restored_and_does_not_change_sampling(setup):
    model, adapter, prompts = setup
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=5, max_answer_tokens=3, seed=9
    )
    engine = HFRolloutEngine.for_adapter(model, adapter)
    reference = engine.sample(prompts, params)
    model.train()
    try:
        again = engine.sample(prompts, params)
        assert model.training
    finally:
        model.eval()
    assert torch.equal(reference.answer_ids, again.answer_ids)


def test_extra_answers_continue_each_thought_and_merge_ragged(setup):
    """sample_answers: counts[b, k] answers after thought (b, k), no others; greedy, they equal the greedy
    answers the first phase sampled after the same thought (prefix cache or recomputed alike); merged with
    with_answers, each thought holds its first answers then its extra ones, absent slots empty."""
    model, adapter, prompts = setup
    params = SamplingParams(
        num_thoughts=3,
        answers_per_thought=2,
        max_thought_tokens=10,
        max_answer_tokens=6,
        seed=3,
        temperature=1.0,
        answer_temperature=0.0,
    )
    counts = torch.tensor([[0, 1, 3], [2, 0, 1]])
    with logit_bias(model, tag_bias(adapter, 4.0)):
        first = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
        extra = HFRolloutEngine.for_adapter(model, adapter).sample_answers(first, counts, params)
        recomputed = HFRolloutEngine.for_adapter(model, adapter, reuse_prefix_cache=False).sample_answers(
            first, counts, params
        )
    assert extra.shape == (2, 3, 3)
    assert torch.equal(extra.answer_counts, counts)
    assert torch.equal(extra.answer_ids, recomputed.answer_ids)
    assert torch.equal(extra.answer_lengths > 0, extra.present)
    for b in range(2):
        for k in range(3):
            for m in range(3):
                if m < counts[b, k]:
                    assert torch.equal(extra.answer_ids[b, k, m], first.answer_ids[b, k, 0])
                    assert extra.answer_texts[b][k][m] == first.answer_texts[b][k][0]
                    torch.testing.assert_close(
                        extra.answer_logprobs[b, k, m], first.answer_logprobs[b, k, 0], atol=1e-4, rtol=0
                    )
                else:
                    assert extra.answer_texts[b][k][m] == "" and extra.answer_finish[b][k][m] == "stop"
    merged = first.with_answers(extra, width=5)
    assert merged.shape == (2, 3, 5)
    assert torch.equal(merged.answer_counts, counts + 2)
    assert torch.equal(merged.present, torch.arange(5) < (counts + 2).unsqueeze(-1))
    assert torch.equal(merged.answer_ids[:, :, :2], first.answer_ids)
    assert merged.answer_texts[0][2][2:] == extra.answer_texts[0][2]
    assert merged.answer_texts[0][0][2:] == ["", "", ""]
    assert not merged.answer_mask[~merged.present].any()
    assert merged.select([1]).answer_counts.tolist() == [(counts[1] + 2).tolist()]


def test_extra_sampled_answers_logprobs_equal_teacher_forced_forward(setup):
    """Sampled extra answers record the log-probs a full forward of prompt + thought + answer gives."""
    model, adapter, prompts = setup
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=8, max_answer_tokens=5, seed=4, top_k=30
    )
    counts = torch.tensor([[2, 0], [1, 3]])
    with logit_bias(model, tag_bias(adapter, 3.0)):
        engine = HFRolloutEngine.for_adapter(model, adapter)
        extra = engine.sample_answers(engine.sample(prompts, params), counts, params)
        segments = [
            s
            for s in answer_segments(extra)
            if extra.present[s.prompt_index, s.thought_index, s.answer_index]
        ]
        assert len(segments) == int(counts.sum())
        rows = [torch.cat([s.context, s.tokens]).tolist() for s in segments]
        batch = collate(prompts, rows, [s.prompt_index for s in segments], adapter.tokens)
        with torch.no_grad():
            logp = model(**batch).logits.float().log_softmax(-1)
    width = batch["input_ids"].shape[1]
    for i, seg in enumerate(segments):
        start = width - len(seg.tokens)
        ref = logp[i, start - 1 : width - 1].gather(-1, seg.tokens[:, None]).squeeze(1)
        torch.testing.assert_close(seg.logprobs, ref, atol=1e-4, rtol=0)
