"""The synthetic arithmetic task: answers checked against Python's own evaluation of the chain, disjoint
splits, determinism by seed, difficulty sizes, thought length, and ``make-data --source arithmetic``."""

from __future__ import annotations

import dataclasses
import json
import random
import re

import pytest

from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.datasets.synthetic.arithmetic import (
    PRESETS,
    ArithmeticConfig,
    draw_problem,
    generate_problems,
    split_of,
)


def evaluate_prompt(prompt: str) -> int:
    """An independent reading of the prompt: ``Compute left to right: 7 +5 *3 -4`` -> eval("((7+5)*3)-4")."""
    start, *steps = prompt.removeprefix("Compute left to right: ").split()
    expression = start
    for step in steps:
        assert re.fullmatch(r"[-+*]\d+", step), step
        expression = f"({expression}){step}"
    return eval(expression)  # noqa: S307 - digits and + - * only, checked above


@pytest.mark.parametrize("difficulty", sorted(PRESETS))
def test_answers_equal_the_left_to_right_evaluation_and_values_stay_in_range(difficulty):
    cfg, rng = PRESETS[difficulty], random.Random(3)
    for _ in range(300):
        problem = draw_problem(rng, cfg)
        assert problem.answer == evaluate_prompt(problem.prompt())
        assert len(problem.steps) == cfg.steps
        assert 1 <= problem.start <= cfg.max_operand
        assert all(1 <= v <= cfg.max_value for v in problem.values)
        assert all(1 <= o <= cfg.max_operand and (op != "*" or o >= 2) for op, o in problem.steps)


def test_the_thought_writes_every_step_and_ends_in_the_answer():
    problem = draw_problem(random.Random(0), PRESETS["normal"])
    parts = problem.thought().split(", ")
    assert len(parts) == 3
    previous = problem.start
    for part, (op, operand), value in zip(parts, problem.steps, problem.values):
        assert part == f"{previous}{op}{operand}={value}"
        assert eval(part.split("=")[0]) == value  # noqa: S307 - digits and one operator
        previous = value
    assert parts[-1].endswith(f"={problem.answer}")


def test_splits_are_disjoint_and_generation_is_deterministic():
    cfg = PRESETS["easy"]
    by_split = {s: generate_problems(200, 0, s, cfg) for s in ("train", "val", "test")}
    prompts = {s: {p.prompt() for p in ps} for s, ps in by_split.items()}
    assert not prompts["train"] & prompts["val"] and not prompts["train"] & prompts["test"]
    assert not prompts["val"] & prompts["test"]
    assert all(split_of(p) == s for s, ps in by_split.items() for p in ps)
    assert generate_problems(50, 0, "val", cfg) == by_split["val"][:50]
    assert generate_problems(50, 1, "val", cfg) != by_split["val"][:50]


def test_answers_are_not_guessable_from_the_operands():
    """No answer of the normal level is common: a constant guess is right less than 5 % of the time."""
    problems = generate_problems(2000, 0, "train", PRESETS["normal"])
    answers = [p.answer for p in problems]
    assert max(answers.count(a) for a in set(answers)) / len(answers) < 0.05
    assert len(set(answers)) > 60


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="max_value must be >= 2 \\* max_operand"):
        dataclasses.replace(ArithmeticConfig(), max_operand=60).validate()
    with pytest.raises(ValueError, match="steps must be in 1..12"):
        ArithmeticConfig(steps=0).validate()
    with pytest.raises(ValueError, match="split must be one of train, val, test"):
        generate_problems(1, 0, "testA", ArithmeticConfig())


def make_data(out, *extra: str) -> int:
    return cli_main(["make-data", "--task", "answer", "--source", "arithmetic", "--out", str(out), *extra])


def test_make_data_writes_text_only_answer_records_with_a_stepwise_thought(tmp_path, capsys):
    out = tmp_path / "data"
    assert make_data(out, "--n", "20", "--split", "val", "--difficulty", "easy", "--seed", "5") == 0
    lines = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(lines) == 20 and not (out / "images").exists()
    for line in lines:
        assert set(line) <= {"id", "task", "prompt", "ground_truth", "split", "meta"}
        assert line["task"] == "answer" and line["split"] == "val"
        assert line["ground_truth"]["answer"] == str(evaluate_prompt(line["prompt"]))
        assert line["ground_truth"].get("matcher") == "numeric"
        assert line["meta"]["thought"].endswith("=" + line["ground_truth"]["answer"])
        assert line["meta"]["difficulty"] == "easy" and line["meta"]["steps"] == 2
    assert len({line["id"] for line in lines}) == 20
    printed = capsys.readouterr().out
    assert f"wrote 20 answer records (arithmetic, seed 5) to {out / 'records.jsonl'}" in printed
    assert "splits: val=20" in printed and "text only" in printed
    assert len(read_records(out / "records.jsonl")) == 20  # what a trainer loads
    again = tmp_path / "again"
    make_data(again, "--n", "20", "--split", "val", "--difficulty", "easy", "--seed", "5")
    assert (again / "records.jsonl").read_bytes() == (out / "records.jsonl").read_bytes()


def test_make_data_sizes_override_the_preset(tmp_path):
    assert (
        make_data(tmp_path / "d", "--n", "5", "--steps", "4", "--max-operand", "12", "--max-value", "500")
        == 0
    )
    lines = [json.loads(line) for line in (tmp_path / "d" / "records.jsonl").read_text().splitlines()]
    assert all(line["meta"]["steps"] == 4 and line["meta"]["difficulty"] == "custom" for line in lines)
    assert all(
        len(line["prompt"].split()) == 4 + 1 + 4 for line in lines
    )  # "Compute left to right:", start, 4 steps


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--split", "testA"], "--split for arithmetic must be one of train, val, test, got 'testA'"),
        (["--difficulty", "relational"], "--difficulty for arithmetic must be one of easy, normal, hard"),
        (
            ["--max-operand", "80"],
            "--steps/--max-operand/--max-value: max_value must be >= 2 \\* max_operand",
        ),
    ],
)
def test_make_data_refuses_bad_arithmetic_options(tmp_path, capsys, extra, message):
    assert make_data(tmp_path / "x", "--n", "3", *extra) != 0
    assert re.search(message, capsys.readouterr().err)


def test_arithmetic_options_are_refused_for_other_sources(tmp_path, capsys):
    args = ["make-data", "--task", "detection", "--source", "shapes", "--n", "1", "--out", str(tmp_path)]
    assert cli_main([*args, "--steps", "3"]) != 0
    assert "--steps applies to --source arithmetic only" in capsys.readouterr().err
