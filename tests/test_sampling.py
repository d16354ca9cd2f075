"""SamplingParams: its range checks, its one constructor's three modes, and config validation reusing the checks."""

from __future__ import annotations

import pytest

from vlm_grpoma.config import ConfigError, RolloutConfig, load_config
from vlm_grpoma.sampling import SamplingParams, SamplingParamsError


def test_sampling_params_validation_and_config():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="answers_per_thought"):
        SamplingParams(answers_per_thought=0)
    params = SamplingParams.from_config(
        RolloutConfig(num_thoughts=8, answers_per_thought=2, temperature=0.7), seed=3
    )
    assert (params.num_thoughts, params.answers_per_thought, params.seed) == (8, 2, 3)
    assert params.phase2_temperature == 0.7
    assert SamplingParams(temperature=1.0, answer_temperature=0.0).phase2_temperature == 0.0


ROLLOUT = RolloutConfig(
    num_thoughts=6,
    answers_per_thought=3,
    temperature=0.7,
    top_p=0.9,
    top_k=5,
    max_thought_tokens=40,
    max_answer_tokens=9,
)


def test_one_constructor_builds_training_sampled_and_greedy_params():
    as_tuple = lambda p: (  # noqa: E731
        p.num_thoughts,
        p.answers_per_thought,
        p.temperature,
        p.top_p,
        p.top_k,
        p.max_thought_tokens,
        p.max_answer_tokens,
        p.seed,
        p.ignore_stop,
    )
    assert as_tuple(SamplingParams.from_config(ROLLOUT, 11)) == (6, 3, 0.7, 0.9, 5, 40, 9, 11, False)
    assert as_tuple(SamplingParams.from_config(ROLLOUT, 2, samples=4)) == (4, 1, 0.7, 0.9, 5, 40, 9, 2, False)
    assert as_tuple(SamplingParams.from_config(ROLLOUT, 2, greedy=True)) == (
        1,
        1,
        0.0,
        1.0,
        0,
        40,
        9,
        2,
        False,
    )
    assert SamplingParams.from_config(ROLLOUT, 0, ignore_stop=True).ignore_stop
    with pytest.raises(ValueError, match=r"^greedy decoding gives one completion per record; got samples=2"):
        SamplingParams.from_config(ROLLOUT, 0, greedy=True, samples=2)
    with pytest.raises(ValueError, match=r"^samples must be >= 1, got 0$"):
        SamplingParams.from_config(ROLLOUT, 0, samples=0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.answers_per_thought=0", r"^rollout\.answers_per_thought: must be >= 1, got 0$"),
        (
            "rollout.temperature=-0.5",
            r"^rollout\.temperature: must be 0 \(greedy\) or >= 0\.01 .*, got -0\.5$",
        ),
        ("rollout.top_p=0", r"^rollout\.top_p: must be in \(0, 1\], got 0(\.0)?$"),
        ("rollout.top_k=-1", r"^rollout\.top_k: must be >= 0 \(0 disables it\), got -1$"),
        ("rollout.max_thought_tokens=0", r"^rollout\.max_thought_tokens: must be >= 1, got 0$"),
        ("rollout.max_answer_tokens=0", r"^rollout\.max_answer_tokens: must be >= 1, got 0$"),
    ],
)
def test_config_validation_reports_the_sampling_checks_under_the_config_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])
    field, value = override.removeprefix("rollout.").split("=")
    with pytest.raises(SamplingParamsError) as direct:  # the same check, raised by the constructor itself
        SamplingParams(**{field: type(getattr(SamplingParams(), field))(value)})
    assert direct.value.field == field


def test_greedy_decoding_is_the_same_with_or_without_the_configs_filters(tiny_model_dir, tmp_path):
    """``eval`` used to keep the config's top-p/top-k for greedy decoding; the constructor turns them off. The
    argmax cannot change: the same tokens come out either way."""
    from dataclasses import replace

    import torch
    from PIL import Image

    from vlm_grpoma.answers import Box, Boxes
    from vlm_grpoma.config import ModelConfig
    from vlm_grpoma.datasets.schema import Record
    from vlm_grpoma.models.loading import load_model
    from vlm_grpoma.rollout.hf import HFRolloutEngine

    loaded = load_model(
        ModelConfig(name_or_path=str(tiny_model_dir("qwen2_vl")), dtype="float32", max_pixels=112 * 112)
    )
    Image.new("RGB", (64, 48), (200, 30, 30)).save(tmp_path / "a.png")
    record = Record(
        "a", str(tmp_path / "a.png"), "detection", "the red square", 64, 48, Boxes((Box(1, 1, 9, 9),))
    )
    prompts = loaded.adapter.build_inputs([record, record])
    greedy = SamplingParams.from_config(ROLLOUT, 0, greedy=True)
    filtered = replace(greedy, top_p=0.3, top_k=2)
    engine = HFRolloutEngine.for_adapter(loaded.model.eval(), loaded.adapter)
    plain, kept = engine.sample(prompts, greedy), engine.sample(prompts, filtered)
    assert torch.equal(plain.thought_ids, kept.thought_ids) and torch.equal(plain.answer_ids, kept.answer_ids)
    assert plain.thought_mask.sum() > 0
