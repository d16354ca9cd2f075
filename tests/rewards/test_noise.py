"""rewards.noise: the flipped score, the kept clean one and the total, per answer, against a hand computation;
the flip rate against the binomial; determinism per seed; the config check."""

from __future__ import annotations

import math

import pytest

from vlm_grpoma.answers import TextAnswer
from vlm_grpoma.config import Config, RewardConfig, RewardNoiseConfig, validate
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.errors import ConfigError
from vlm_grpoma.rewards.base import Completion
from vlm_grpoma.rewards.noise import NoisyRewards
from vlm_grpoma.rewards.registry import build_rewards


def batch(n: int) -> tuple[list[Completion], list[Record]]:
    """``n`` answers to "2+2", every third one wrong."""
    records = [Record(f"r{i}", None, "answer", "2+2", 0, 0, ShortAnswer("4")) for i in range(n)]
    answers = [TextAnswer("5" if i % 3 == 0 else "4") for i in range(n)]
    return [Completion(answer) for answer in answers], records


def noisy(flip: float, seed: str = "0/0") -> NoisyRewards:
    return NoisyRewards(build_rewards({"answer_match": 2.0, "format": 0.5}), "answer_match", flip, seed)


def test_a_flipped_answer_scores_one_minus_its_clean_score_in_the_total_too():
    completions, records = batch(300)
    clean = build_rewards({"answer_match": 2.0, "format": 0.5}).score(completions, records)
    result = noisy(0.3).score(completions, records)
    assert result.components["answer_match/clean"] == clean.components["answer_match"]
    for i, flipped in enumerate(result.components["noise/flipped"]):
        s = clean.components["answer_match"][i]
        assert result.components["answer_match"][i] == (1 - s if flipped else s)
        assert result.total[i] == pytest.approx(clean.total[i] + 2.0 * (1 - 2 * s) * flipped)
    rate = sum(result.components["noise/flipped"]) / 300
    assert abs(rate - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 300)


def test_draws_are_the_same_for_a_seed_and_differ_between_seeds():
    completions, records = batch(64)
    first = noisy(0.5).score(completions, records).components["noise/flipped"]
    assert noisy(0.5).score(completions, records).components["noise/flipped"] == first
    assert noisy(0.5, "0/1").score(completions, records).components["noise/flipped"] != first


def test_a_noise_reward_outside_the_weights_is_one_line():
    config = Config(rewards=RewardConfig(noise=RewardNoiseConfig(flip=0.2, reward="iou_typo")))
    with pytest.raises(ConfigError, match=r"rewards\.noise\.reward: 'iou_typo' is not in rewards\.weights"):
        validate(config)
    with pytest.raises(ConfigError, match=r"rewards\.noise\.flip"):
        validate(Config(rewards=RewardConfig(noise=RewardNoiseConfig(flip=0.7))))
