"""User errors are one line and exit code 1 (under the launcher too), and impossible settings are refused."""

from __future__ import annotations

import pytest
from fault_runs import error_lines, launch, run_cli

from vlm_grpoma.config import load_config
from vlm_grpoma.errors import ConfigError


@pytest.mark.parametrize(
    "override,message",
    [
        ("optim.learning_rate=.inf", "optim.learning_rate: must be a finite number, got inf"),
        ("optim.learning_rate=.nan", "optim.learning_rate: must be a finite number, got nan"),
        ("rewards.weights={iou: .nan}", "rewards.weights.iou: must be a finite number, got nan"),
        ("algorithm.clip_eps_high=.inf", "algorithm.clip_eps_high: must be a finite number, got inf"),
        ("train.dist_timeout_s=0", "train.dist_timeout_s: must be > 0 seconds, got 0.0"),
        ("data.max_prompt_tokens=-1", "data.max_prompt_tokens: must be >= 0 (0: no limit), got -1"),
        (
            "logging.output_dir=",
            "logging.output_dir: is empty: name the folder that receives metrics and "
            "checkpoints, e.g. runs/my-run",
        ),
    ],
)
def test_impossible_settings_are_one_line_config_errors(override, message):
    with pytest.raises(ConfigError) as caught:
        load_config(None, [override])
    assert str(caught.value) == message


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_a_bad_resume_path_names_the_key_once(overrides, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    result = run_cli(
        "train", "--config", str(config), *overrides(tmp_path / "run", f"checkpoint.resume={tmp_path}")
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert error_lines(result.stderr) == [
        f"vlm-grpoma train: error: checkpoint.resume: {tmp_path} is not a complete checkpoint folder "
        "(no checkpoint.json); use auto or a step-NNNNNNNN folder"
    ]


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_an_empty_records_file_says_so(overrides, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    result = run_cli(
        "train", "--config", str(config), *overrides(tmp_path / "run", f"data.train_path={empty}")
    )
    assert result.returncode == 1
    assert error_lines(result.stderr) == [
        f"vlm-grpoma train: error: data.train_path: {empty} has no detection records of split 'train' "
        "(data.task, data.train_split); it has no valid records"
    ]


@pytest.mark.slow
@pytest.mark.launcher
def test_a_user_error_under_the_launcher_is_one_line_and_no_traceback(overrides, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    missing = tmp_path / "nope.jsonl"
    run = launch(config, *overrides(tmp_path / "run", f"data.train_path={missing}"))
    assert run.returncode != 0
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout
    lines = error_lines(run.stderr)
    assert 1 <= len(lines) <= 2 and set(lines) == {  # each rank that got there says the same
        f"vlm-grpoma train: error: data.train_path: {missing}: records file not found"
    }
