"""Bad inputs to a training run fail with one clear line before (or instead of) loading a model."""

from __future__ import annotations

import pytest

from vlm_grpoma.datasets.jsonl import read_records, write_records
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.errors import CheckpointError, ConfigError, DataError
from vlm_grpoma.rewards.registry import build_rewards
from vlm_grpoma.trainer.base import training_records
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
from vlm_grpoma.trainer.sft import SFTTrainer


@pytest.fixture(scope="module")
def mixed_path(tmp_path_factory):
    """4 detection/train, 2 detection/test and 2 trajectory/train records in one file."""
    folder = tmp_path_factory.mktemp("mixed")
    records = (
        read_records(generate_shapes("detection", 4, folder / "a", seed=0, config=EASY))
        + read_records(generate_shapes("detection", 2, folder / "b", seed=1, split="test", config=EASY))
        + read_records(generate_shapes("trajectory", 2, folder / "c", seed=2))
    )
    return write_records(folder / "all.jsonl", records)


def test_training_uses_only_the_configured_task_and_split(make_config, mixed_path):
    kept = training_records(make_config(f"data.train_path={mixed_path}"))
    assert len(kept) == 4 and {(r.task, r.split) for r in kept} == {("detection", "train")}
    assert len(training_records(make_config(f"data.train_path={mixed_path}", "data.train_split=test"))) == 2


def test_no_matching_records_names_what_the_file_has(make_config, mixed_path):
    with pytest.raises(
        DataError,
        match=r"no affordance records of split 'train'.*4 detection/train, "
        r"2 trajectory/train",
    ):
        training_records(make_config(f"data.train_path={mixed_path}", "data.task=affordance"))


def test_missing_records_file_is_one_line(make_config, tmp_path):
    with pytest.raises(DataError, match=r"^data\.train_path: .*nope\.jsonl: records file not found"):
        training_records(make_config(f"data.train_path={tmp_path / 'nope.jsonl'}"))


def test_misspelt_reward_fails_before_the_model_loads(make_config, mixed_path, monkeypatch):
    monkeypatch.setattr(
        "vlm_grpoma.trainer.base.build_engine",
        lambda *a, **k: pytest.fail("the engine was built before the rewards were checked"),
    )
    with pytest.raises(ConfigError, match=r"^rewards\.weights\.iuo: unknown reward 'iuo'"):
        GRPOMATrainer(make_config(f"data.train_path={mixed_path}", "rewards.weights={iuo: 1.0}"))


def test_reward_options_reach_the_reward_and_bad_ones_name_the_key():
    rewards = build_rewards({"iou": 1.0}, {"iou": {"mode": "giou", "threshold": 0.5}})
    assert rewards.rewards["iou"][1].mode == "giou"
    with pytest.raises(ValueError, match=r"^rewards\.options\.iou: .*mode"):
        build_rewards({"iou": 1.0}, {"iou": {"mode": "dice"}})
    with pytest.raises(ValueError, match=r"^rewards\.options\.iou: .*unexpected keyword"):
        build_rewards({"iou": 1.0}, {"iou": {"radius": 3}})


def test_bad_resume_path_is_one_line(make_config, mixed_path, tmp_path):
    with pytest.raises(CheckpointError, match=r"^checkpoint\.resume: .*nowhere is not a complete checkpoint"):
        GRPOMATrainer(
            make_config(f"data.train_path={mixed_path}", f"checkpoint.resume={tmp_path / 'nowhere'}")
        )


def test_sft_holds_no_reference_model_even_with_kl_beta(make_config, mixed_path):
    run = SFTTrainer(make_config(f"data.train_path={mixed_path}", "algorithm.kl_beta=0.04"))
    assert run.engine.reference_module is None and not run.engine.has_reference
