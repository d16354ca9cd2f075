"""Token-budget micro-batches: every prompt once, every micro-batch within the budget, the same gradient."""

import random

import pytest
import torch

from tests.trainer.test_packed import _load, _prompts, _ragged_tree
from vlm_grpoma.trainer.micro_batches import (
    fixed_count,
    prompts_per_micro_batch,
    row_tokens,
    split_to,
    token_budget,
)
from vlm_grpoma.trainer.packed import pack, shared_prefix_log_probs


def _cost(group, lengths, rows):
    return len(group) * rows * max(lengths[i] for i in group)


@pytest.mark.parametrize("seed", range(5))
def test_token_budget_bounds_every_micro_batch_and_keeps_every_prompt(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(50, 4000) for _ in range(rng.randint(1, 40))]
    rows, budget = rng.choice([1, 4, 16]), rng.choice([4096, 16384, 65536])
    groups = token_budget(lengths, rows, budget)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert _cost(g, lengths, rows) <= budget or len(g) == 1
    # no two neighbouring groups could have been one (the greedy fill is tight)
    for a, b in zip(groups, groups[1:]):
        assert _cost(a + b[:1], lengths, rows) > budget
    for count in range(len(groups), len(lengths) + 1, max(len(lengths) // 4, 1)):
        split = split_to(groups, count)
        assert len(split) == count and all(split)
        assert sorted(i for g in split for i in g) == list(range(len(lengths)))
        assert all(_cost(g, lengths, rows) <= budget or len(g) == 1 for g in split)


def test_over_budget_prompt_is_alone_and_too_many_splits_are_refused():
    assert token_budget([900, 100, 100, 100], 1, 300) == [[0], [1, 2, 3]]
    assert fixed_count(5, 2) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="cannot make 3 micro-batches of 2 prompts"):
        split_to([[0, 1]], 3)
    assert prompts_per_micro_batch(10_000, 3000, 1) == 3
    assert prompts_per_micro_batch(10_000, 3000, 4) == 1  # at least one, even over the budget


def test_row_tokens_are_the_packed_and_path_row_lengths(tiny_model_dir, tmp_path):
    model, adapter = _load(tiny_model_dir, "qwen2_vl", lora=False)
    tree = _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens, k=3, m=2)
    shared, one = row_tokens(tree, "shared")
    packed = pack(model, tree, [0, 1, 2], adapter.tokens)
    assert one == 1 and shared == packed.valid.sum(1).tolist()
    naive, paths = row_tokens(tree, "naive")
    assert paths == 6
    for b, prompt in enumerate(tree.prompts):
        longest = max(
            len(tree.thought_tokens(b, k)) + len(tree.answer_tokens(b, k, m))
            for k in range(3)
            for m in range(2)
        )
        assert naive[b] == len(prompt.input_ids) + longest


def test_token_budget_micro_batches_give_the_one_micro_batch_gradient(tiny_model_dir, tmp_path):
    """Per-token weights fixed over the whole batch (as the GRPO-MA loss's are): the summed gradients of the
    token-budget micro-batches equal the gradient of one micro-batch holding every prompt."""
    model, adapter = _load(tiny_model_dir, "qwen2_5_vl", lora=False)
    tree = _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens, k=3, m=2, seed=8)
    lengths, rows = row_tokens(tree, "shared")
    groups = token_budget(lengths, rows, budget=2 * max(lengths) - 1)
    assert len(groups) >= 2
    g = torch.Generator().manual_seed(3)
    w_thought, w_answer = (
        torch.randn(tree.thought_ids.shape, generator=g),
        torch.randn(tree.answer_ids.shape, generator=g),
    )

    def gradient(chunks):
        model.zero_grad()
        for chunk in chunks:
            logp = shared_prefix_log_probs(model, tree, chunk, adapter.tokens)
            ((logp.thought * w_thought[chunk]).sum() + (logp.answer * w_answer[chunk]).sum()).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole, split = gradient([[0, 1, 2]]), gradient(groups)
    assert len(whole) == len(split) and any(w.abs().sum() > 0 for w in whole)
    for a, b in zip(split, whole):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("stage", [0, 2])
def test_grpo_ma_step_under_a_token_budget_equals_one_micro_batch(stage, make_config, tmp_path):
    """The trainer with train.micro_batch_tokens takes the step one micro-batch of every prompt takes (the
    same gradient norm and weights), in more, budget-bounded micro-batches."""
    from length_reward import AnswerLength  # noqa: F401  (registers test_answer_length)

    from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
    from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

    data = generate_shapes("detection", 4, tmp_path / "data", seed=0, config=EASY)
    common = (
        f"data.train_path={data}",
        "rewards.weights={test_answer_length: 1.0}",
        "train.steps=1",
        "train.prompts_per_step=4",
        f"deepspeed.zero_stage={stage}",
        "rollout.num_thoughts=2",
        "rollout.answers_per_thought=2",
        "rollout.max_thought_tokens=8",
        "rollout.max_answer_tokens=6",
    )
    results = {}
    for name, extra in (("one", "train.micro_batch_prompts=4"), ("budget", "train.micro_batch_tokens=480")):
        trainer = GRPOMATrainer(make_config(*common, extra, f"logging.output_dir={tmp_path / name}"))
        compute, sizes = trainer._log_probs, []  # one training forward per micro-batch (no KL, one epoch)

        def log_probs(model, tree, chunk, options, compute=compute, sizes=sizes):
            lengths, _ = row_tokens(tree, "shared")
            sizes.append(len(chunk) * max(lengths[i] for i in chunk))
            return compute(model, tree, chunk, options)

        trainer._log_probs = log_probs
        (metrics,) = trainer.train()
        params = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}
        results[name] = (metrics, params, len(sizes), sizes)
        trainer.engine.close()
    (one, one_params, one_calls, _), (budget, budget_params, budget_calls, sizes) = (
        results["one"],
        results["budget"],
    )
    assert one_calls == 1 and 2 <= budget_calls < 4
    assert all(size <= 480 for size in sizes), sizes
    assert budget["train/grad_norm"] == pytest.approx(one["train/grad_norm"], rel=1e-5)
    assert budget["loss/total"] == pytest.approx(one["loss/total"], rel=1e-5, abs=1e-7)
    for name, value in one_params.items():
        torch.testing.assert_close(budget_params[name], value, atol=1e-5, rtol=0)
