"""The ``manipulation`` reward: executes answers in SAPIEN workers; malformed answers score 0."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vlm_grpoma.answers import Box, Boxes, ContactAction, ParseError
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.envs.sapien.task import sample_split_episode
from vlm_grpoma.rewards.base import Completion
from vlm_grpoma.rewards.manipulation import COMPONENTS, ManipulationReward
from vlm_grpoma.rewards.registry import build_reward, build_rewards, registered_rewards


def _record(i: int) -> tuple[Record, ContactAction]:
    spec, oracle = sample_split_episode("train", i, 0)
    record = Record(
        f"m{i}",
        "img.png",
        "manipulation",
        "open it",
        spec.camera.width,
        spec.camera.height,
        oracle,
        "train",
        spec.to_meta(),
    )
    return record, oracle


@pytest.fixture(scope="module")
def reward():
    r = build_reward("manipulation", workers=2)
    yield r
    r.close()


def test_registered():
    assert "manipulation" in registered_rewards()
    assert isinstance(build_reward("manipulation", workers=1), ManipulationReward)


def test_scores_oracle_random_and_malformed(reward):
    (r0, a0), (r1, a1) = _record(0), _record(1)
    answers = [
        a0,  # oracle: success
        replace(a1, point=(0.5, 0.5)),  # background pixel
        ParseError("no_answer_tag"),
        Boxes((Box(0, 0, 1, 1),)),  # wrong answer type for the task
        a1,
    ]
    records = [r0, r1, r1, r1, r1]
    result = reward.score([Completion(a) for a in answers], records)
    assert result.total == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert set(result.components) == set(COMPONENTS)
    assert result.components["success"] == result.total
    assert result.components["joint_progress"][0] > 0.05 and result.components["joint_progress"][1] == 0
    assert result.components["executed"] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert result.failures == {"off_object": 1, "no_answer_tag": 1, "wrong_kind": 1}


def test_bad_meta_names_the_record(reward):
    record, oracle = _record(2)
    broken = replace(record, id="broken-7", meta={"object": {"category": "oven"}})
    with pytest.raises(ValueError, match="broken-7"):
        reward.score([Completion(oracle)], [broken])


def test_all_malformed_needs_no_simulator():
    r = ManipulationReward(workers=1)
    result = r.score([Completion(ParseError("bad_json"))], [_record(0)[0]])
    assert result.total == [0.0] and r._pool is None


def test_records_execute_under_their_own_protocol(reward, tmp_path):
    """A record made on a PartNet-Mobility object under manipllm is scored under manipllm (gravity, approach):
    its demonstration succeeds, and the same answer run under the simple protocol behaves differently."""
    from vlm_grpoma.envs.sapien.manipllm import sample_asset_episode
    from vlm_grpoma.envs.sapien.partnet import scan_assets
    from vlm_grpoma.envs.sapien.partnet_export import generate_assets
    from vlm_grpoma.envs.sapien.task import EpisodeSpec, execute

    generate_assets(tmp_path, 1, categories=("box_lid",))
    spec, demo = sample_asset_episode(scan_assets(tmp_path)[0], 2)
    record, _ = _record(0)
    record = replace(record, id="asset-0", meta=spec.to_meta(), ground_truth=demo)
    result = reward.score([Completion(demo)], [record])
    assert result.total == [1.0] and EpisodeSpec.from_meta(record.meta).protocol == "manipllm"
    direct = execute(spec, demo)
    assert result.components["joint_progress"][0] == direct.progress
    simple = execute(replace(spec, protocol="simple"), demo)
    assert simple.progress != direct.progress


def test_frozen_worker_deadline_is_an_option():
    assert ManipulationReward(timeout_s=5).job_deadline_s == 65  # the episode limit plus the slack
    assert build_reward("manipulation", job_deadline_s=2.5).job_deadline_s == 2.5
    with pytest.raises(ValueError, match="rewards.options.manipulation: job_deadline_s must be"):
        build_rewards({"manipulation": 1.0}, {"manipulation": {"job_deadline_s": 0}})
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="job_deadline_s must be a positive number of seconds"):
            ManipulationReward(job_deadline_s=bad)
