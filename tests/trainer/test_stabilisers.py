"""Stabilisers in the trainer, on the tiny model: tempered log-probs equal TRL's at T = 0.7, truncated thoughts'
closing tokens are not trained, and each option trains a step."""

from __future__ import annotations

import pytest
import torch
from length_reward import AnswerLength  # noqa: F401  (registers test_answer_length)
from PIL import Image

from vlm_grpoma.algorithm import grpo_ma_advantages, grpo_ma_token_weights, policy_loss
from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import AlgorithmConfig, ModelConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
from vlm_grpoma.trainer.logprobs import ScoringOptions, path_log_probs
from vlm_grpoma.trainer.packed import shared_prefix_log_probs
from vlm_grpoma.trainer.segments import SegmentTargets, micro_batch_segments

T, TOP_P, EPS = 0.7, 0.9, 0.2


@pytest.fixture(scope="module")
def sampled(tiny_model_dir, tmp_path_factory):
    """A K=3, M=1 tree sampled at T = 0.7, top-p 0.9 with tempered log-probs, its model and adapter."""
    loaded = load_model(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_5_vl")), dtype="float32"))
    model, adapter = loaded.model.eval(), loaded.adapter
    folder = tmp_path_factory.mktemp("images")
    records = []
    for i, (w, h) in enumerate([(80, 64), (56, 100)]):
        Image.new("RGB", (w, h), (60 * i, 100, 180)).save(folder / f"{i}.png")
        records.append(
            Record(
                f"r{i}", str(folder / f"{i}.png"), "detection", "the square", w, h, Boxes((Box(1, 1, 9, 9),))
            )
        )
    params = SamplingParams(
        num_thoughts=3,
        answers_per_thought=1,
        temperature=T,
        top_p=TOP_P,
        max_thought_tokens=6,
        max_answer_tokens=5,
        seed=11,
        tempered_logprobs=True,
    )
    tree = HFRolloutEngine.for_adapter(model, adapter).sample(adapter.build_inputs(records), params)
    return model, adapter, tree


@pytest.mark.parametrize("compute", [path_log_probs, shared_prefix_log_probs], ids=["naive", "shared"])
def test_tempered_passes_reproduce_the_tempered_rollout_log_probs(sampled, compute):
    model, adapter, tree = sampled
    with torch.no_grad():
        tempered = compute(model, tree, [0, 1], adapter.tokens, ScoringOptions(temperature=T))
        raw = compute(model, tree, [0, 1], adapter.tokens)
    torch.testing.assert_close(tempered.thought, tree.thought_logprobs * tree.thought_mask, atol=1e-4, rtol=0)
    torch.testing.assert_close(tempered.answer, tree.answer_logprobs * tree.answer_mask, atol=1e-4, rtol=0)
    assert (tempered.answer - raw.answer).abs().max() > 1e-2  # the temperature matters at T = 0.7


def trl_log_probs(model, adapter, tree, b, k):
    """TRL's per-token log-probs of one completion (thought ⊕ answer): log_softmax(logits / T) gathered."""
    prompt = tree.prompts[b]
    completion = torch.cat([tree.thought_tokens(b, k), tree.answer_tokens(b, k, 0)])
    ids = torch.cat([prompt.input_ids, completion])[None]
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": prompt.pixel_values,
        "image_grid_thw": prompt.image_grid_thw,
    }
    inputs["mm_token_type_ids"] = (ids == adapter.tokens.image_id).long()
    logits = model(**inputs, use_cache=False).logits[0, -len(completion) - 1 : -1].float() / T
    return logits.log_softmax(-1).gather(-1, completion[:, None]).squeeze(-1)


def test_m1_tempered_loss_equals_trls_grpo_loss_at_t07_top_p(sampled):
    """TRL: coef = exp(logp - old) with logp = log_softmax(logits / T); loss_type grpo; here with
    policy = old (one epoch), so the loss is -mean_i mean_t A_i and its gradient TRL's."""
    model, adapter, tree = sampled
    rewards = torch.tensor([[[0.2], [0.9], [0.4]], [[0.1], [0.1], [0.7]]])
    closing = len(adapter.tokens.think_close)
    thought_mask = tree.thought_loss_mask(closing)
    thought_adv, answer_adv = grpo_ma_advantages(rewards)
    t_w, a_w = grpo_ma_token_weights(thought_mask.sum(-1), tree.answer_lengths)
    targets = SegmentTargets(thought_adv, answer_adv, t_w, a_w, thought_mask)
    logp = path_log_probs(model, tree, [0, 1], adapter.tokens, ScoringOptions(temperature=T))
    parts = micro_batch_segments(tree, [0, 1], logp, targets, None, None, AlgorithmConfig(), "none", None)
    ours = sum(policy_loss(p, clip_eps_low=EPS, clip_eps_high=EPS, kl_beta=0.0).loss for p in parts)
    ours_grad = torch.autograd.grad(
        ours, [p for p in model.parameters() if p.requires_grad], allow_unused=True
    )

    losses = []
    for b in range(2):
        for k in range(3):
            trl = trl_log_probs(model, adapter, tree, b, k)
            n_thought = int(tree.thought_lengths[b, k])
            trained = torch.ones(len(trl), dtype=torch.bool)
            trained[n_thought - closing : n_thought] = not bool(tree.thought_truncated[b, k])
            coef = torch.exp(trl - trl.detach())
            per_token = -torch.min(
                coef * answer_adv[b, k, 0], coef.clamp(1 - EPS, 1 + EPS) * answer_adv[b, k, 0]
            )
            losses.append((per_token * trained).sum() / trained.sum())
    trl_loss = torch.stack(losses).mean()
    trl_grad = torch.autograd.grad(
        trl_loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True
    )
    torch.testing.assert_close(ours.detach(), trl_loss.detach(), atol=1e-6, rtol=0)
    for got, expected in zip(ours_grad, trl_grad):
        if expected is not None:
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-4)


def test_closing_tokens_of_truncated_thoughts_get_no_loss_weight(sampled):
    _, adapter, tree = sampled
    closing = len(adapter.tokens.think_close)
    loss_mask = tree.thought_loss_mask(closing)
    assert tree.thought_truncated.any()  # a 6-token budget truncates the random model's thoughts
    for b in range(tree.shape[0]):
        for k in range(tree.shape[1]):
            n = int(tree.thought_lengths[b, k])
            if tree.thought_truncated[b, k]:
                assert not loss_mask[b, k, n - closing : n].any()
                assert loss_mask[b, k, : n - closing].all()
            else:
                assert torch.equal(loss_mask[b, k], tree.thought_mask[b, k])


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    return generate_shapes("detection", 8, tmp_path_factory.mktemp("shapes"), seed=0, config=EASY)


OPTIONS = {
    "tis": ["algorithm.rollout_correction.mode=tis"],
    "mis-sequence": ["algorithm.rollout_correction.mode=mis", "algorithm.rollout_correction.level=sequence"],
    "gspo": ["algorithm.importance_sampling_level=sequence", "algorithm.policy_epochs=2"],
    "entropy": ["algorithm.entropy_coef=0.01", "algorithm.top_entropy_fraction=0.5"],
    "sqrt-thoughts": ["algorithm.thought_weighting=sqrt_answers", "train.logprob_pass=naive"],
    "raw-logprobs": ["algorithm.logprob_temperature=raw"],
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_each_option_trains_a_step(make_config, data_path, name):
    config = make_config(
        f"data.train_path={data_path}",
        "rewards.weights={test_answer_length: 1.0, format: 0.5}",
        "rollout.num_thoughts=2",
        "rollout.answers_per_thought=2",
        "rollout.max_thought_tokens=8",
        "rollout.max_answer_tokens=6",
        "rollout.temperature=0.7",
        "train.steps=1",
        *OPTIONS[name],
    )
    trainer = GRPOMATrainer(config)
    before = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}
    (metrics,) = trainer.train()
    assert metrics["train/skipped_steps"] == 0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.engine.module.named_parameters())
    assert metrics["entropy/thought_mean"] > 0 and metrics["entropy/answer_mean"] > 0
    if name in ("tis", "mis-sequence"):
        # hf rollouts are the trainer's own policy: every ratio is 1 up to float noise, nothing corrected
        assert metrics["rollout_correction/ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["rollout_correction/clipped_fraction"] == 0
        assert metrics["rollout_correction/masked_fraction"] == 0
    else:
        assert "rollout_correction/ratio_mean" not in metrics
    if name == "entropy":
        assert 0.3 < metrics["entropy/masked_fraction"] < 0.7
    if name == "raw-logprobs":
        assert metrics["rollout/logp_mismatch_max"] < 1e-4  # raw on both sides agree too
    trainer.engine.close()
