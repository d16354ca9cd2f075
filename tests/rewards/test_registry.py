"""Every built-in reward follows the same contract: found by name, batch checked, malformed answers score 0."""

import pytest

from vlm_grpoma.answers import Box, Boxes, ContactAction, ParseError, Points, Trajectory
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.rewards import Completion, build_reward, register_reward, registered_rewards
from vlm_grpoma.rewards.registry import BUILTIN_REWARDS

GROUND_TRUTH = {
    "format": ("detection", Boxes((Box(1, 1, 5, 5),))),
    "iou": ("detection", Boxes((Box(1, 1, 5, 5),))),
    "affordance": ("affordance", Points(((3.0, 3.0),))),
    "trajectory": ("trajectory", Trajectory(((1.0, 1.0), (5.0, 5.0)))),
    "manipulation": ("manipulation", ContactAction((3.0, 3.0), (0.0, 0.0, 1.0), (1.0, 0.0, 0.0))),
    "answer_match": ("answer", ShortAnswer("3")),
}


def record(name: str) -> Record:
    task, truth = GROUND_TRUTH[name]
    return Record(id="r0", image="x.png", task=task, prompt="p", width=10, height=10, ground_truth=truth)


def test_every_builtin_reward_is_listed_and_has_a_test_record():
    assert set(BUILTIN_REWARDS) == set(GROUND_TRUTH)
    assert set(BUILTIN_REWARDS) <= set(registered_rewards())


@pytest.mark.parametrize("name", sorted(BUILTIN_REWARDS))
def test_a_batch_with_a_missing_record_is_refused_naming_the_reward(name):
    reward = build_reward(name, workers=1) if name == "manipulation" else build_reward(name)
    with pytest.raises(ValueError, match=rf"^{name} reward: 2 completions but 1 records$"):
        reward.score([Completion(ParseError("no_answer_tag"))] * 2, [record(name)])


@pytest.mark.parametrize("name", sorted(BUILTIN_REWARDS))
def test_malformed_and_wrong_kind_answers_score_zero_with_their_reason(name):
    reward = build_reward(name, workers=1) if name == "manipulation" else build_reward(name)
    wrong_kind = Points(((3.0, 3.0),)) if name != "affordance" else Boxes((Box(1, 1, 5, 5),))
    batch = [Completion(ParseError("no_answer_tag")), Completion(wrong_kind)]
    result = reward.score(batch, [record(name)] * 2)
    assert result.total == [0.0, 0.0]
    assert result.failures.get("no_answer_tag") == 1
    assert result.failures.get("wrong_kind") == 1
    if hasattr(reward, "close"):
        reward.close()


def test_registered_rewards_take_their_name_once_and_never_twice():
    class Constant:
        def score(self, completions, records):
            from vlm_grpoma.rewards import RewardResult

            return RewardResult([0.25] * len(completions))

    register_reward("test_registry_constant", Constant)
    assert build_reward("test_registry_constant").score(
        [Completion(ParseError("x"))], [record("iou")]
    ).total == [0.25]
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_registry_constant", Constant)
    with pytest.raises(ValueError, match="already registered"):
        register_reward("iou", Constant)


@pytest.mark.parametrize(
    "weights, task, problem",
    [
        ({"iou": 1.0, "format": 0.5}, "answer", "rewards.weights.iou: scores image coordinates"),
        ({"format": 1.0, "manipulation": 1.0}, "answer", "rewards.weights.manipulation: scores image"),
        ({"answer_match": 1.0}, "detection", "rewards.weights.answer_match: scores short text answers"),
        ({"answer_match": 1.0, "format": 0.5}, "answer", None),
        ({"iou": 1.0, "format": 0.5}, "detection", None),
        ({"format": 1.0, "my.py:fn": 1.0}, "answer", None),  # the user's own function: not second-guessed
    ],
)
def test_rewards_that_could_only_score_zero_on_the_task_are_refused(weights, task, problem):
    from vlm_grpoma.rewards.registry import check_rewards_fit_task

    if problem is None:
        check_rewards_fit_task(weights, task)
        return
    with pytest.raises(ValueError, match=problem):
        check_rewards_fit_task(weights, task)
