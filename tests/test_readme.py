"""Every command in the README works when pasted into a shell: each ``bash`` block passes ``bash -n``, every
line splits as the shell splits it, ``vlm-grpoma`` lines parse with the CLI's own parser and their overrides
build a valid config, scripts and configs they name exist; the example records are valid records, the
example reward runs, and the cheap commands (building a tiny model, the RefCOCO pickle step) are run."""

from __future__ import annotations

import json
import pickle
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from vlm_grpoma.cli import build_parser
from vlm_grpoma.config import load_config
from vlm_grpoma.datasets.jsonl import record_from_json

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", README, flags=re.MULTILINE | re.DOTALL)
PLACEHOLDERS = {"…", "CONFIG", "DIR"}


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCKS if lang == language]


def commands(block: str) -> list[list[str]]:
    """The block's commands as the shell splits them (continuations joined, comments dropped, ``$V`` set)."""
    variables, out = {}, []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if len(words) == 1 and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            name, value = words[0].split("=", 1)
            variables[name] = value
            continue
        out.append([re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), w) for w in words])
    return out


def without_env(words: list[str]) -> list[str]:
    """The command after any ``NAME=value`` environment assignments."""
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
    return words


ALL_COMMANDS = [c for block in blocks("bash") for c in commands(block)]


def test_the_readme_has_commands_records_and_a_reward():
    assert len(ALL_COMMANDS) > 30 and blocks("json") and blocks("python")


@pytest.mark.parametrize("block", blocks("bash"), ids=lambda b: b.splitlines()[0][:40])
def test_bash_blocks_are_valid_shell(block):
    result = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def check_overrides(config: str | None, overrides: list[str]) -> None:
    """The overrides build a valid config, on top of ``config`` when it is a file of this repository."""
    overrides = [o for o in overrides if o not in PLACEHOLDERS]
    path = REPO / config if config and (REPO / config).is_file() else None
    load_config(path, overrides)


@pytest.mark.parametrize(
    "words",
    [c for c in ALL_COMMANDS if without_env(c)[0].endswith("vlm-grpoma")],
    ids=lambda c: " ".join(c)[:70],
)
def test_vlm_grpoma_commands_parse_and_their_overrides_validate(words):
    argv = without_env(words)[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        pytest.fail(f"argparse refused {' '.join(words)} (exit {exit_.code})")
    config = getattr(args, "config", None)
    if config and config not in PLACEHOLDERS:
        assert (REPO / config).is_file() or config.endswith("run.yaml"), f"{config} is not in the repository"
    check_overrides(config, list(getattr(args, "overrides", [])))


@pytest.mark.parametrize(
    "words",
    [c for c in ALL_COMMANDS if without_env(c)[0] == "launch/train.sh"],
    ids=lambda c: " ".join(c)[:70],
)
def test_launcher_commands_name_a_config_and_valid_overrides(words):
    config, *overrides = without_env(words)[1:]
    assert config in PLACEHOLDERS or (REPO / config).is_file(), config
    check_overrides(config, overrides)


@pytest.mark.parametrize(
    "words",
    [c for c in ALL_COMMANDS if without_env(c)[0].endswith("python") and c[1] != "-c"],
    ids=lambda c: " ".join(c)[:70],
)
def test_python_scripts_exist(words):
    assert (REPO / without_env(words)[1]).is_file(), words


def test_inline_overrides_with_spaces_are_quoted():
    for span in re.findall(r"`([^`\n]+)`", README):
        for match in re.finditer(r"(\S+)=\{[^}]*\s", span):  # key={a: 1, ...} unquoted splits in a shell
            assert match.group(1).startswith("'"), f"quote the override in `{span}`"


@pytest.mark.parametrize("block", blocks("json"), ids=lambda b: b[:30])
def test_example_records_are_valid(block):
    lines = [json.loads(line) for line in block.splitlines() if line.strip()]
    assert {r["task"] for r in lines} == {"detection", "affordance", "trajectory", "manipulation"}
    for obj in lines:
        record_from_json(obj, Path("."))


def test_example_reward_function_runs(tmp_path):
    from vlm_grpoma.answers import Box, Boxes, ParseError
    from vlm_grpoma.rewards import Completion, build_rewards

    (source,) = [b for b in blocks("python") if "def one_box" in b]
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "one_box.py").write_text(source)
    spec = f"{tmp_path}/rewards/one_box.py:one_box"
    rewards = build_rewards({spec: 1.0}, {spec: {"bonus": 2.0}})
    from vlm_grpoma.datasets.schema import Record

    record = Record("r", "x.png", "detection", "p", 10, 10, Boxes((Box(0, 0, 5, 5),)))
    batch = [Completion(Boxes((Box(0, 0, 5, 5),))), Completion(ParseError("no_answer_tag"))]
    assert rewards.score(batch, [record, record]).total == [2.0, 0.0]


def test_refcoco_pickle_step_runs_as_pasted(tmp_path):
    (line,) = [line for b in blocks("bash") for line in b.splitlines() if line.startswith("python -c ")]
    refs = [{"ref_id": 1, "ann_id": 2, "image_id": 3, "split": "testA", "sentences": [{"sent": "left man"}]}]
    (tmp_path / "data" / "raw" / "refcoco").mkdir(parents=True)
    (tmp_path / "data" / "raw" / "refcoco" / "refs(unc).p").write_bytes(pickle.dumps(refs))
    result = subprocess.run(
        ["bash", "-c", line.replace("python", sys.executable, 1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "data" / "raw" / "refcoco" / "refs(unc).json").read_text()) == refs


def test_make_tiny_model_commands_run(tmp_path):
    tiny = [c for c in ALL_COMMANDS if "make-tiny-model" in c]
    assert tiny
    for words in tiny:
        argv = [sys.executable, "-m", "vlm_grpoma.cli", *without_env(words)[1:]]
        result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        out = build_parser().parse_args(without_env(words)[1:]).out
        assert (tmp_path / out / "config.json").is_file()
