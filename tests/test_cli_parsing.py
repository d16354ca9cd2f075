"""How the CLI reads its arguments: overrides anywhere after the command, the config keys in `--help`, the
optional packages a config needs named before any model loads, and one line for unreadable YAML."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from vlm_grpoma import cli
from vlm_grpoma.config import config_reference


def _write(tmp_path: Path, text: str = "{}\n") -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def _error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.removeprefix(f"vlm-grpoma {command}: error: ").rstrip("\n")


@pytest.mark.parametrize("command", ["train", "sft"])
def test_help_lists_every_config_key_with_its_doc(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for doc in config_reference():
        assert f"\n  {doc.key}=" in out, doc.key
        assert " ".join(doc.doc.split()[:4]) in " ".join(out.split()), doc.key
    assert "  train.dist_timeout_s=600.0  (float, > 0 seconds, at most 604800)" in out


def test_overrides_may_sit_between_flags(tmp_path, capsys):
    args = cli.build_parser().parse_args(
        ["train", "train.steps=3", "--config", "run.yaml", "seed=1", "rollout.num_thoughts=8"]
    )
    assert args.config == "run.yaml" and args.overrides == [
        "train.steps=3",
        "seed=1",
        "rollout.num_thoughts=8",
    ]
    plan = cli.build_parser().parse_args(["plan", "--gpus", "2", "c.yaml", "a=1", "--nodes", "4", "b=2"])
    assert (plan.config, plan.overrides, plan.gpus, plan.nodes) == ("c.yaml", ["a=1", "b=2"], 2, 4)
    # and the override before --config is the one that applies
    assert cli.main(["train", "rollout.num_thoughts=1", "--config", _write(tmp_path)]) == 1
    assert _error_line(capsys, "train").startswith("rollout.num_thoughts: must be >= 2")


def test_unknown_flags_are_still_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--config", _write(tmp_path), "--steps", "3"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --steps" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override,package,message",
    [
        ("rollout.backend=vllm", "vllm", "rollout.backend=vllm needs vLLM, which is not installed here"),
        (
            "logging.wandb_project=p",
            "wandb",
            "logging.wandb_project=p needs wandb, which is not installed here",
        ),
    ],
)
def test_a_missing_optional_package_is_named_before_any_model_loads(
    tmp_path, capsys, override, package, message
):
    """#32 item 6: the model path does not exist, so reaching the model would fail differently."""
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    missing = f"model.name_or_path={tmp_path / 'no-such-model'}"
    code = cli.main(
        ["train", "--config", _write(tmp_path), override, missing, f"logging.output_dir={tmp_path}/r"]
    )
    assert code == 1 and _error_line(capsys, "train").startswith(message)
    assert not (tmp_path / "r").exists()  # nothing was started


def test_sft_does_not_need_the_rollout_backend(tmp_path):
    from vlm_grpoma.config import check_optional_dependencies, load_config

    check_optional_dependencies(load_config(overrides=["rollout.backend=vllm"]), "sft")


@pytest.mark.parametrize(
    "raw,message",
    [
        (b"a: &a [x, x]\nb: [*a, *a]\n", r"run\.yaml: line 2: aliases \(\*a\) are not accepted"),
        (b"seed: \xff\n", r"run\.yaml: not UTF-8 text \(byte 0xff at 6\)"),
        (b"[" * 3000 + b"]" * 3000, r"run\.yaml: line 1: nested deeper than 32 levels"),
    ],
    ids=["alias", "non-utf8", "deep"],
)
def test_hostile_yaml_is_one_line_through_the_cli(tmp_path, capsys, raw, message):
    path = tmp_path / "run.yaml"
    path.write_bytes(raw)
    assert cli.main(["train", "--config", str(path)]) == 1
    assert __import__("re").search(message, _error_line(capsys, "train"))
