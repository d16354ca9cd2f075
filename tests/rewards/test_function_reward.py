"""Rewards as plain functions in the user's own file (``path/to/file.py:function``): built from the config
name, options bound up front, every problem one line naming ``rewards.weights.<name>`` before any model loads."""

from __future__ import annotations

import textwrap

import pytest

from vlm_grpoma.answers import Box, Boxes, ParseError
from vlm_grpoma.rewards import Completion, build_rewards
from vlm_grpoma.rewards.function import RewardFileError, is_function_spec

REWARD_FILE = textwrap.dedent(
    '''
    from vlm_grpoma.answers import Boxes


    def box_count(completion, record, *, per_box=1.0):
        """per_box for each predicted box, 0 for a malformed answer."""
        if not isinstance(completion.answer, Boxes):
            return 0.0
        return per_box * len(completion.answer.boxes)


    def short_thought(completion, record):
        return len(completion.thought_text) < 30


    def broken(completion, record):
        return "high"


    def crashes(completion, record):
        return 1 / 0
    '''
)


@pytest.fixture
def reward_file(tmp_path, monkeypatch):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARD_FILE)
    monkeypatch.chdir(tmp_path)  # relative specs start at the folder the command runs in
    return path


def test_spec_is_a_python_file_and_a_function_name():
    assert is_function_spec("rewards/my.py:score") and is_function_spec("/abs/x.py:f_2")
    assert not is_function_spec("iou") and not is_function_spec("x.txt:f") and not is_function_spec("x.py:")


def test_weighted_with_builtin_rewards_options_and_relative_path(reward_file, make_record):
    rewards = build_rewards(
        {"iou": 1.0, "my_rewards.py:box_count": 0.5, f"{reward_file}:short_thought": 2.0},
        {"my_rewards.py:box_count": {"per_box": 3.0}},
    )
    record = make_record(Boxes((Box(0, 0, 10, 10),)))
    two_boxes = Boxes((Box(0, 0, 10, 10), Box(20, 20, 30, 30)))
    batch = [
        Completion(two_boxes, "<think>short</think>", "<answer>…</answer>"),
        Completion(ParseError("no_answer_tag"), "<think>" + "long " * 10 + "</think>", "oops"),
    ]
    result = rewards.score(batch, [record, record])
    assert result.components["my_rewards.py:box_count"] == [6.0, 0.0]
    assert result.components[f"{reward_file}:short_thought"] == [1.0, 0.0]
    iou = result.components["iou"]
    assert iou[0] == pytest.approx(0.5) and iou[1] == 0.0  # one of two boxes matched exactly
    assert result.total == pytest.approx([0.5 + 0.5 * 6.0 + 2.0, 0.0])


@pytest.mark.parametrize(
    ("weights", "options", "message"),
    [
        ({"missing.py:f": 1.0}, {}, r"^rewards\.weights\.missing\.py:f: reward file missing\.py not found"),
        ({"my_rewards.py:nope": 1.0}, {}, r"^rewards\.weights\.my_rewards\.py:nope: .* no function 'nope'"),
        (
            {"my_rewards.py:short_thought": 1.0},
            {"my_rewards.py:short_thought": {"scale": 2}},
            r"^rewards\.options\.my_rewards\.py:short_thought: .*must accept \(completion, record, scale=\)",
        ),
    ],
)
def test_unusable_reward_is_one_line_naming_the_config_key(reward_file, weights, options, message):
    with pytest.raises(ValueError, match=message):
        build_rewards(weights, options)


def test_import_error_in_the_file_is_reported(tmp_path, monkeypatch):
    (tmp_path / "bad.py").write_text("import not_a_module_anywhere\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"importing bad\.py failed: ModuleNotFoundError"):
        build_rewards({"bad.py:f": 1.0})


def test_a_non_number_or_a_crash_names_the_reward_and_record(reward_file, make_record):
    record = make_record(Boxes((Box(0, 0, 10, 10),)), rid="rec-9")
    batch = [Completion(ParseError("x"))]
    with pytest.raises(RewardFileError, match=r"my_rewards\.py:broken returned 'high' .* record rec-9"):
        build_rewards({"my_rewards.py:broken": 1.0}).score(batch, [record])


def test_a_crashing_function_is_one_line_naming_the_record_and_its_line(
    reward_file, make_record, monkeypatch
):
    record = make_record(Boxes((Box(0, 0, 10, 10),)), rid="rec-9")
    batch = [Completion(ParseError("x"))]
    line = REWARD_FILE.splitlines().index("    return 1 / 0") + 1
    with pytest.raises(RewardFileError) as caught:
        build_rewards({"my_rewards.py:crashes": 1.0}).score(batch, [record])
    assert str(caught.value) == (
        "reward my_rewards.py:crashes raised ZeroDivisionError: division by zero scoring record rec-9 at "
        f"{reward_file}:{line}: return 1 / 0 (VLM_GRPOMA_DEBUG=1 shows the traceback)"
    )
    monkeypatch.setenv("VLM_GRPOMA_DEBUG", "1")  # the user's own exception, traceback and all
    with pytest.raises(ZeroDivisionError) as caught:
        build_rewards({"my_rewards.py:crashes": 1.0}).score(batch, [record])
    assert caught.value.__notes__ == ["in reward my_rewards.py:crashes scoring record rec-9"]


def test_grpo_trainer_refuses_a_bad_reward_file_before_loading_the_model(reward_file, tmp_path):
    from vlm_grpoma.config import load_config
    from vlm_grpoma.errors import UserError
    from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

    config = load_config(
        None,
        [
            f"model.name_or_path={tmp_path / 'no-model-here'}",
            f"data.train_path={tmp_path / 'no-data-here.jsonl'}",
            "rewards.weights={my_rewards.py:nope: 1.0}",
        ],
    )
    with pytest.raises(UserError, match=r"^rewards\.weights\.my_rewards\.py:nope: "):
        GRPOMATrainer(config)


TRL_FILE = textwrap.dedent(
    '''
    CALLS = []


    def accuracy(completions, solution, **kwargs):
        """A TRL reward reading a dataset column: 1 when the completion contains the solution."""
        CALLS.append({"completions": completions, "solution": solution, **kwargs})
        return [float(s in c) if s else None for c, s in zip(completions, solution)]


    def short_list(completions, **kwargs):
        return [1.0]


    def huge(completions, **kwargs):
        return [10**400 for _ in completions]


    def huge_one(completion, record):
        return -(10**400)
    '''
)


@pytest.fixture
def trl_file(tmp_path, monkeypatch):
    (tmp_path / "trl_rewards.py").write_text(TRL_FILE)
    monkeypatch.chdir(tmp_path)
    return "trl_rewards.py"


def test_a_trl_reward_gets_texts_prompts_and_record_fields(trl_file, make_record):
    import math

    from vlm_grpoma.rewards.function import load_function

    reward = build_rewards({f"{trl_file}:accuracy": 1.0}).rewards[f"{trl_file}:accuracy"][1]
    assert reward.trl_style
    a = make_record(Boxes((Box(0, 0, 10, 10, "cat"),)), rid="a")
    a.meta.update(solution="cat")
    b = make_record(Boxes((Box(0, 0, 10, 10, "dog"),)), rid="b")
    b.meta.update(solution="")
    batch = [
        Completion(ParseError("x"), "<think>a cat</think>", "<answer>[]</answer>"),
        Completion(ParseError("x"), "so a dog\n</think>", "<answer>[]</answer>", thought_opened=True),
    ]
    result = reward.score(batch, [a, b])
    assert result.total[0] == 1.0 and math.isnan(result.total[1])  # None: unscorable
    [call] = load_function(f"{trl_file}:accuracy").__globals__["CALLS"]
    assert call["completions"] == [
        "<think>a cat</think><answer>[]</answer>",
        "<think>so a dog\n</think><answer>[]</answer>",  # <think> added where the prompt opened it
    ]
    assert call["prompts"] == ["p", "p"] and call["id"] == ["a", "b"] and call["solution"] == ["cat", ""]
    assert call["ground_truth"][0] == {"boxes": [{"bbox_2d": [0, 0, 10, 10], "label": "cat"}]}
    assert call["width"] == [640, 640] and call["meta"] == [a.meta, b.meta]


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("short_list", r"short_list returned \[1\.0\] .*a list of 2 numbers or None"),
        ("huge", r"huge returned an integer of 401 digits for record a, beyond float range"),
        ("huge_one", r"huge_one returned an integer of 401 digits for record a, beyond float range"),
    ],
)
def test_a_bad_trl_list_or_an_int_beyond_float_range_is_one_line(trl_file, make_record, function, message):
    """#36 L15: an int beyond float range is a one-line error naming the reward and record."""
    records = [make_record(Boxes(()), rid="a"), make_record(Boxes(()), rid="b")]
    batch = [Completion(ParseError("x")), Completion(ParseError("x"))]
    with pytest.raises(RewardFileError, match=message):
        build_rewards({f"{trl_file}:{function}": 1.0}).score(batch, records)


def test_a_timeout_must_be_positive_and_is_not_passed_on(trl_file):
    with pytest.raises(
        ValueError, match=r"rewards\.options\.trl_rewards\.py:huge: timeout_s must be a positive"
    ):
        build_rewards({f"{trl_file}:huge": 1.0}, {f"{trl_file}:huge": {"timeout_s": 0}})
    reward = build_rewards({f"{trl_file}:huge": 1.0}, {f"{trl_file}:huge": {"timeout_s": 2.5}})
    assert reward.rewards[f"{trl_file}:huge"][1].options == {}
