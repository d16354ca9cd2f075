"""``train.time_budget_s``: a run stops after the step that spends its training-time budget, evaluates then,
checkpoints, and a resumed run keeps counting the time already spent."""

from __future__ import annotations

import json

import pytest

from vlm_grpoma.config import ConfigError, load_config
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    return generate_shapes("detection", 8, tmp_path_factory.mktemp("shapes"), seed=0, config=EASY)


def budget_config(make_config, data_path, *extra):
    return make_config(
        f"data.train_path={data_path}",
        f"data.eval_sets={{held: {data_path}}}",
        "train.eval_every=100",  # only before step 1 and after the last step
        "train.eval_batch_prompts=4",
        "rollout.max_thought_tokens=6",
        "rollout.max_answer_tokens=6",
        "train.steps=50",
        *extra,
    )


def test_a_spent_budget_ends_the_run_with_a_final_evaluation_and_checkpoint(make_config, data_path):
    trainer = GRPOMATrainer(budget_config(make_config, data_path, "train.time_budget_s=1e-6"))
    history = trainer.train()
    assert trainer.step == 1 and len(history) == 1
    assert "eval/held/reward_mean" in history[0], "the run's last step is evaluated even off the schedule"
    assert history[0]["time/trained_s"] == pytest.approx(history[0]["time/step_s"])
    assert (trainer.final_model_dir / "config.json").is_file()
    rows = [json.loads(line) for line in open(f"{trainer.config.logging.output_dir}/metrics.jsonl")]
    assert [row["step"] for row in rows] == [0, 1]


def test_a_resumed_run_counts_the_time_already_spent(make_config, data_path):
    first = GRPOMATrainer(budget_config(make_config, data_path, "train.steps=2", "train.eval_every=0"))
    spent = first.train()[-1]["time/trained_s"]
    first.engine.close()
    resumed = GRPOMATrainer(
        budget_config(make_config, data_path, "train.steps=3", "train.eval_every=0", "checkpoint.resume=auto")
    )
    assert resumed.step == 2 and resumed.trained_seconds == pytest.approx(spent)
    assert resumed.train()[-1]["time/trained_s"] > spent


def test_the_budget_must_be_a_finite_non_negative_number():
    with pytest.raises(ConfigError, match=r"^train\.time_budget_s: must be a finite number"):
        load_config(overrides=["train.time_budget_s=-1"])
    with pytest.raises(ConfigError, match=r"^train\.time_budget_s: must be a finite number"):
        load_config(overrides=["train.time_budget_s=.inf"])
