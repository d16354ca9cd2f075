"""Config loading, overrides and validation: each bad input gives its specific one-line message."""

import subprocess
import sys
from pathlib import Path

import pytest

from vlm_grpoma.cli import main
from vlm_grpoma.config import Config, ConfigError, gradient_accumulation_steps, load_config, validate

GOOD = """
model: {name_or_path: /models/tiny, dtype: float32}
rollout: {num_thoughts: 4, answers_per_thought: 4, temperature: 1.0}
algorithm: {kl_beta: 0.0, loss_aggregation: token_mean}
rewards: {weights: {iou: 1.0, format: 0.5}}
train: {steps: 10, prompts_per_step: 8, micro_batch_prompts: 2}
seed: 3
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_good_config_loads_typed_values_and_overrides(tmp_path):
    config = load_config(
        write(tmp_path, GOOD),
        [
            "rollout.num_thoughts=8",
            "optim.learning_rate=2e-5",
            "model.lora.enabled=true",
            "rewards.weights.iou=2",
            "model.lora.target_modules=[q_proj, v_proj]",
        ],
    )
    assert isinstance(config, Config)
    assert config.rollout.num_thoughts == 8 and config.rollout.answers_per_thought == 4
    assert config.optim.learning_rate == 2e-5 and isinstance(config.optim.learning_rate, float)
    assert config.model.lora.enabled is True and config.model.lora.target_modules == ["q_proj", "v_proj"]
    assert config.rewards.weights == {"iou": 2.0, "format": 0.5}
    assert config.algorithm.loss_aggregation == "token_mean" and config.seed == 3
    assert config.to_dict()["train"]["micro_batch_prompts"] == 2


def test_defaults_alone_are_valid():
    validate(load_config())


def test_integers_widen_to_floats_but_not_the_reverse(tmp_path):
    assert load_config(overrides=["rollout.temperature=1"]).rollout.temperature == 1.0
    assert load_config(write(tmp_path, "optim: {learning_rate: 1e-6}")).optim.learning_rate == 1e-6
    with pytest.raises(ConfigError, match=r"^rollout\.num_thoughts: must be an integer, got 4\.5$"):
        load_config(overrides=["rollout.num_thoughts=4.5"])


BAD = [
    ("rollout: {num_thoughts: 1}", r"^rollout\.num_thoughts: must be >= 2 .*got 1$"),
    (
        "rollout: {num_thoughtz: 4}",
        r"^rollout\.num_thoughtz: unknown key \(did you mean 'rollout\.num_thoughts'\?\)$",
    ),
    ("rolout: {num_thoughts: 4}", r"^rolout: unknown key \(did you mean 'rollout'\?\)$"),
    ("rollout: {num_thoughts: four}", r"^rollout\.num_thoughts: must be an integer, got 'four'$"),
    ("rollout: {num_thoughts: true}", r"^rollout\.num_thoughts: must be an integer, got True$"),
    ("rollout: {answers_per_thought: 0}", r"^rollout\.answers_per_thought: must be >= 1, got 0$"),
    ("rollout: {top_p: 1.5}", r"^rollout\.top_p: must be in \(0, 1\], got 1\.5$"),
    ("rollout: 4", r"^rollout: expected a mapping of settings, got int 4$"),
    (
        "algorithm: {advantage_scale: mad}",
        r"^algorithm\.advantage_scale: must be one of 'std', 'none', got 'mad'$",
    ),
    ("algorithm: {loss_aggregation: sum}", r"^algorithm\.loss_aggregation: must be one of"),
    ("algorithm: {clip_eps_low: 1.2}", r"^algorithm\.clip_eps_low: must be in \[0, 1\), got 1\.2$"),
    ("algorithm: {kl_beta: -0.1}", r"^algorithm\.kl_beta: must be >= 0, got -0\.1$"),
    ("algorithm: {policy_epochs: 0}", r"^algorithm\.policy_epochs: must be >= 1, got 0$"),
    (
        "model: {lora: {enabled: yes please}}",
        r"^model\.lora\.enabled: must be true or false, got 'yes please'$",
    ),
    (
        "model: {dtype: float8}",
        r"^model\.dtype: must be one of 'auto', 'float32', 'bfloat16', 'float16', got 'float8'$",
    ),
    ("model: {min_pixels: 1000000, max_pixels: 1000}", r"^model\.min_pixels: \(1000000\) must not exceed"),
    (
        "model: {lora: {target_modules: q_proj}}",
        r"^model\.lora\.target_modules: must be a list of str, got 'q_proj'$",
    ),
    ("rewards: {weights: {iou: high}}", r"^rewards\.weights\.iou: must be a number, got 'high'$"),
    ("rewards: {weights: {}}", r"^rewards\.weights: needs at least one reward function$"),
    (
        "train: {eval_every: 5}",
        r"^data\.eval_sets: is empty but train\.eval_every=5; name the held-out records",
    ),
    ("train: {eval_every: -1}", r"^train\.eval_every: must be >= 0 \(0 disables evaluation\), got -1$"),
    (
        "data: {eval_sets: [a.jsonl]}",
        r"^data\.eval_sets: must be a mapping of str to str, got \['a\.jsonl'\]$",
    ),
    ("deepspeed: {zero_stage: 4}", r"^deepspeed\.zero_stage: must be one of 0, 1, 2, 3, got 4$"),
    ("deepspeed: {zero_stage: true}", r"^deepspeed\.zero_stage: must be one of 0, 1, 2, 3, got True$"),
    (
        "train: {prompts_per_step: 6, micro_batch_prompts: 4}",
        r"^train\.micro_batch_prompts: 4 does not divide the 6 prompts each of 1 rank\(s\) gets per step",
    ),
    ("train: {steps: 0}", r"^train\.steps: must be >= 1, got 0$"),
    ("optim: {learning_rate: 0}", r"^optim\.learning_rate: must be > 0, got 0\.0$"),
    ("seed: [1]", r"^seed: must be an integer, got \[1\]$"),
    ("- a\n- b", r"run\.yaml: the top level must be a mapping of sections, got list$"),
    ("rollout: {num_thoughts: 4\n", r"run\.yaml: not valid YAML at line \d+"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[b[0][:40] for b in BAD])
def test_bad_yaml_gives_its_specific_message(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize(
    "override,message",
    [
        ("rollout.num_thoughts", r"^rollout\.num_thoughts: overrides are written key=value"),
        ("=3", r"^=3: the key before '=' is empty or malformed$"),
        ("rollout..k=3", r"malformed"),
        ("seed.value=3", r"^seed: must be an integer, got \{'value': 3\}$"),
        ("train=3", r"^train: expected a mapping of settings, got int 3$"),
        ("rollout.temperature=[1", r"^rollout\.temperature: cannot parse override value"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_missing_file():
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found$"):
        load_config("nope.yaml")


def test_batch_arithmetic_against_world_size(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    assert gradient_accumulation_steps(config, world_size=2) == 2
    with pytest.raises(
        ConfigError, match=r"^train\.prompts_per_step: 8 prompts per step do not divide across 3 ranks$"
    ):
        validate(config, world_size=3)
    with pytest.raises(
        ConfigError, match=r"^train\.micro_batch_prompts: 2 does not divide the 1 prompts each of 8"
    ):
        validate(config, world_size=8)


@pytest.mark.parametrize("text,message", BAD[:3] + BAD[-6:-4], ids=[b[0][:40] for b in BAD[:3] + BAD[-6:-4]])
def test_cli_exits_non_zero_with_one_line(tmp_path, capsys, text, message):
    code = main(["train", "--config", str(write(tmp_path, text))])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith("vlm-grpoma train: error: ")
    assert __import__("re").search(message.lstrip("^"), err.removeprefix("vlm-grpoma train: error: "))


def test_cli_reads_world_size_from_the_launcher_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["train", "--config", str(write(tmp_path, GOOD))]) == 1
    assert "do not divide across 3 ranks" in capsys.readouterr().err


def test_console_script_exit_code(tmp_path):
    exe = Path(sys.executable).with_name("vlm-grpoma")
    result = subprocess.run(
        [str(exe), "train", "--config", str(write(tmp_path, BAD[0][0]))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("vlm-grpoma train: error: rollout.num_thoughts: must be >= 2")


REPO = Path(__file__).resolve().parents[1]
SHIPPED_CONFIGS = sorted(
    path
    for folder in ("configs", "vlm_grpoma/configs", "benchmarks/comparison/configs")
    for path in (REPO / folder).rglob("*.yaml")
)


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_configs_validate(path):
    config = load_config(path)
    validate(config, world_size=8 if "7b" in path.name else 1)


def test_shared_prefix_pass_needs_a_4d_mask_capable_attention():
    with pytest.raises(
        ConfigError, match=r"^train\.logprob_pass: 'shared' needs model\.attn_implementation sdpa"
    ):
        load_config(overrides=["model.attn_implementation=flash_attention_2"])
    load_config(overrides=["model.attn_implementation=flash_attention_2", "train.logprob_pass=naive"])


def test_reward_options_are_typed_and_must_name_a_weighted_reward():
    config = load_config(overrides=["rewards.options={iou: {mode: giou, threshold: 0.5}}"])
    assert config.rewards.options == {"iou": {"mode": "giou", "threshold": 0.5}}
    with pytest.raises(
        ConfigError, match=r"^rewards\.options\.trajectory: options for a reward that is not in"
    ):
        load_config(overrides=["rewards.options={trajectory: {num_points: 8}}"])


def test_vllm_engine_settings_are_validated():
    with pytest.raises(
        ConfigError, match=r"^rollout\.vllm\.gpu_memory_utilization: must be in \(0, 1\], got 1\.5$"
    ):
        load_config(overrides=["rollout.vllm.gpu_memory_utilization=1.5"])
