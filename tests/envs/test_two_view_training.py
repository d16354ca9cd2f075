"""A manipulation run whose records show two SAPIEN views (front and wrist) trains on the tiny model: the
rollout's log-probs are the trainer's, the manipulation reward executes the answers in the front view, and the
held-out set with the same two views is scored; a model limited to one image refuses the records in one line."""

from __future__ import annotations

import math

import pytest

from vlm_grpoma.datasets.synthetic import sapien as sapien_data
from vlm_grpoma.envs.sapien.vulkan import rendering_status
from vlm_grpoma.errors import DataError
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_view_records(tmp_path_factory):
    ok, reason = rendering_status(in_process=True)
    if not ok:
        pytest.skip(f"Vulkan rendering unavailable: {reason}")
    root = tmp_path_factory.mktemp("two-views")
    views = ("front", "wrist")
    train = sapien_data.generate("manipulation", 4, root / "train", 1, "train", views=views)
    unseen = sapien_data.generate("manipulation", 2, root / "unseen", 2, "unseen", views=views)
    return train, unseen


def test_a_two_view_manipulation_run_trains_and_scores_its_held_out_set(
    two_view_records, tiny_model_dir, tmp_path
):
    from vlm_grpoma.config import load_config

    train, unseen = two_view_records
    overrides = [
        f"model.name_or_path={tiny_model_dir('qwen2_vl')}",
        f"logging.output_dir={tmp_path / 'run'}",
        f"data.train_path={train}",
        f"data.eval_sets={{unseen: {unseen}}}",
        "data.task=manipulation",
        "model.max_images=2",
        "model.max_pixels=12544",
        "model.prompt_style=compact",
        "rewards.weights={manipulation: 1.0, format: 0.5}",
        "rollout.num_thoughts=2",
        "rollout.answers_per_thought=2",
        "rollout.max_thought_tokens=8",
        "rollout.max_answer_tokens=12",
        "train.steps=2",
        "train.prompts_per_step=2",
        "train.micro_batch_prompts=1",
        "train.eval_every=2",
        "deepspeed.zero_stage=0",
        "seed=0",
    ]
    trainer = GRPOMATrainer(load_config(None, overrides))
    history = trainer.train()
    assert trainer.step == 2
    for metrics in history:
        assert metrics["rollout/logp_mismatch_mean"] < 1e-4  # two images: still the trainer's log-probs
        assert math.isfinite(metrics["reward/manipulation_mean"]) and math.isfinite(metrics["loss/total"])
    assert any(key.startswith("eval/unseen/") for key in history[-1])

    one_image = load_config(None, [*overrides, "model.max_images=1", f"logging.output_dir={tmp_path / 'r1'}"])
    with pytest.raises(DataError, match=r"\(id sapien-manipulation-train-1-000000\): 2 images, more than "):
        GRPOMATrainer(one_image)
