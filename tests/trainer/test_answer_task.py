"""``vlm-grpoma sft``, ``eval`` and ``train`` on short-answer (task ``answer``) records, every family, through the
CLI: arithmetic records from ``make-data --task answer --source arithmetic``, text-only and with images beside
text-only records in one batch.

A random tiny model never answers right, so each family is first warm-started by SFT on the reference thoughts
(it memorises some of the 8 training problems): its greedy answers are then partly right (accuracy > 0, checked
against the ground truth independently of the reward code), its samples at temperature 0.5 differ (pass@k checked
against the binomial formula) and the GRPO-MA rewards of a prompt differ (so the update has a signal)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import load_file

from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.jsonl import read_records, write_records
from vlm_grpoma.models.families import ARCHS

#: SFT steps after which the tiny models write well-formed answers, some right (measured greedy accuracy on the
#: 8 records: 1/8 qwen2_vl, 2/8 qwen2_5_vl, 6/8 qwen3_vl).
SFT_STEPS = 40


def _write_config(path: Path, model: Path, records: Path, output_dir: Path, **sections) -> Path:
    """A run YAML for the tiny model on ``records`` (answer records), the test's sections merged over it."""
    config = {
        "model": {"name_or_path": str(model), "dtype": "float32", "max_pixels": 64 * 64},
        "data": {"train_path": str(records), "eval_path": str(records), "task": "answer", "shuffle": False},
        "rewards": {
            "weights": {"answer_match": 1.0, "format": 0.5},
            "options": {"answer_match": {"matcher": "numeric"}},
        },
        "rollout": {
            "num_thoughts": 4,
            "answers_per_thought": 2,
            "max_thought_tokens": 24,
            "max_answer_tokens": 6,
            "temperature": 0.5,  # the warm start's answers, varied: some right, some not
        },
        "algorithm": {"kl_beta": 0.04},
        "optim": {"learning_rate": 1e-3},
        "train": {"steps": 2, "prompts_per_step": 4, "micro_batch_prompts": 2, "eval_batch_prompts": 8},
        "deepspeed": {"zero_stage": 0},
        "logging": {"output_dir": str(output_dir), "progress_bar": False},
        "seed": 0,
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    path.write_text(yaml.safe_dump(config))
    return path


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


@pytest.fixture(scope="module")
def answer_records(tmp_path_factory) -> dict[str, Path]:
    """``text``: 8 arithmetic train records (text-only); ``mixed``: the same with every other one pictured."""
    root = tmp_path_factory.mktemp("answer-data")
    argv = ["make-data", "--task", "answer", "--source", "arithmetic", "--n", "8", "--difficulty", "easy"]
    assert cli_main([*argv, "--out", str(root / "text"), "--seed", "3"]) == 0
    text = root / "text" / "records.jsonl"
    records = read_records(text)
    assert len(records) == 8 and all(r.text_only for r in records)
    pictured = []
    for i, record in enumerate(records):
        if i % 2:
            image = root / "images" / f"{record.id}.png"
            image.parent.mkdir(exist_ok=True)
            Image.new("RGB", (48 + 8 * i, 40), (20 * i, 120, 200)).save(image)
            record = dataclasses.replace(record, image=str(image), width=48 + 8 * i, height=40)
        pictured.append(record)
    return {"text": text, "mixed": write_records(root / "mixed" / "records.jsonl", pictured)}


@pytest.fixture(scope="module", params=ARCHS)
def warm_start(request, answer_records, tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """Per family: ``vlm-grpoma sft`` on the mixed answer records (text-only and pictured in every batch)."""
    torch.set_num_threads(1)
    arch, root = request.param, tmp_path_factory.mktemp(f"answer-{request.param}")
    config = _write_config(
        root / "sft.yaml",
        tiny_model_dir(arch),
        answer_records["mixed"],
        root / "sft",
        train={"steps": SFT_STEPS, "prompts_per_step": 8, "micro_batch_prompts": 8},
        optim={"learning_rate": 3e-3},
    )
    assert cli_main(["sft", "--config", str(config)]) == 0
    model = root / "sft" / "checkpoints" / f"step-{SFT_STEPS:08d}" / "model"
    return {"root": root, "run": root / "sft", "model": model}


def test_sft_on_answer_records_lowers_the_nll_and_saves_a_checkpoint(warm_start):
    rows = _metrics(warm_start["run"])
    assert [r["step"] for r in rows] == list(range(1, SFT_STEPS + 1))
    nll = [r["sft/nll"] for r in rows]
    assert all(math.isfinite(v) for v in nll) and nll[-1] < 0.5 * nll[0]
    assert (warm_start["model"] / "model.safetensors").is_file()


def test_eval_reports_answer_accuracy_and_pass_at_k(warm_start, answer_records, capsys):
    """Greedy accuracy is the share of answers equal to the ground truth as numbers; ``--samples 4`` gives
    pass@k = mean over records of 1 - C(n-c, k) / C(n, k) from the written predictions."""
    records = {r.id: r for r in read_records(answer_records["mixed"])}
    base = ["eval", "--checkpoint", str(warm_start["run"]), "--split", "train"]
    outputs = {}
    for samples in (1, 4):
        out = warm_start["root"] / f"eval-{samples}"
        capsys.readouterr()
        assert cli_main([*base, "--samples", str(samples), "--out", str(out)]) == 0
        assert "| accuracy |" in capsys.readouterr().out
        metrics = json.loads((out / "train" / "metrics.json").read_text())
        lines = [json.loads(line) for line in (out / "train" / "predictions.jsonl").read_text().splitlines()]
        assert metrics["tasks"].keys() == {"answer"} and len(lines) == 8 * samples
        assert not (out / "train" / "overlays").exists() or not any((out / "train" / "overlays").iterdir())
        summary = json.loads((out / "summary.json").read_text())
        assert (
            summary["splits"]["train"]["answer"]["accuracy"]
            == metrics["tasks"]["answer"]["metrics"]["accuracy"]
        )
        outputs[samples] = metrics["tasks"]["answer"], lines

    def right(line) -> bool:  # independent of answer_match: the parsed text as a number against the truth
        try:
            return line["parsed"] is not None and float(line["parsed"]) == float(
                records[line["id"]].ground_truth.answer
            )
        except ValueError:
            return False

    greedy, lines = outputs[1]
    assert all(line["scores"]["correct"] == float(right(line)) for line in lines)
    assert greedy["metrics"]["accuracy"] == pytest.approx(sum(map(right, lines)) / 8)
    assert greedy["metrics"]["accuracy"] > 0, "the SFT warm start should answer some training problems right"
    assert greedy["format_rate"] > 0.5
    assert {records[line["id"]].text_only for line in lines} == {True, False}  # both kinds were scored

    sampled, lines = outputs[4]
    correct = defaultdict(int)
    for line in lines:
        correct[line["id"]] += right(line)
    assert len(correct) == 8 and any(0 < c < 4 for c in correct.values())  # pass@k differs from pass@1
    for k in (1, 2, 4):
        expected = sum(1 - math.comb(4 - c, k) / math.comb(4, k) for c in correct.values()) / 8
        assert sampled["metrics"][f"pass@{k}"] == pytest.approx(expected, abs=1e-12)
    assert sampled["metrics"]["pass@1"] == pytest.approx(sampled["metrics"]["accuracy"])
    assert sampled["metrics"]["best_of_4/correct"] == pytest.approx(sampled["metrics"]["pass@4"])


def _train_from_warm_start(warm_start, records: Path, name: str, **sections) -> tuple[Path, list[dict]]:
    """``vlm-grpoma train`` from the family's SFT checkpoint on ``records``; the run folder and its metrics."""
    root = warm_start["root"]
    config = _write_config(root / f"{name}.yaml", warm_start["model"], records, root / name, **sections)
    assert cli_main(["train", "--config", str(config)]) == 0
    return root / name, _metrics(root / name)


def _assert_trained(run: Path, rows: list[dict], start_model: Path) -> None:
    """Metrics rows for both steps, finite losses, a gradient on a step where some prompt's rewards differ (its
    advantages are non-zero), a moved policy (the KL term is non-zero once it has), and a checkpoint whose
    weights differ from the start."""
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in (
            "loss/total",
            "loss/kl",
            "train/grad_norm",
            "reward/answer_match_mean",
            "reward/format_mean",
        ):
            assert math.isfinite(row[key]), key
        assert row["train/skipped_steps"] == 0
    varied = [r for r in rows if r["adv/answer_abs_mean"] > 0]
    assert varied, "the warm-started policy's answers to a prompt should differ in reward"
    assert all(r["train/grad_norm"] > 0 and r["reward/total_std"] > 0 for r in varied)
    if rows[0]["train/grad_norm"] > 0:  # the policy moved away from the reference: the KL term is non-zero
        assert rows[1]["loss/kl"] > 0 and rows[1]["loss/total"] != 0
    model = run / "checkpoints" / "step-00000002" / "model"
    assert (run / "checkpoints" / "step-00000002" / "checkpoint.json").is_file()
    after, before = _weights(model), _weights(start_model)
    assert after.keys() == before.keys() and any(not torch.equal(after[n], before[n]) for n in before)


def test_train_on_text_only_answer_records(warm_start, answer_records):
    """With held-out scoring during training (``data.eval_sets``): greedy answers scored by the same rewards
    before step 1 and after the last."""
    run, rows = _train_from_warm_start(
        warm_start,
        answer_records["text"],
        "grpo-text",
        data={"eval_sets": {"held": str(answer_records["text"])}},
        train={"eval_every": 2},
    )
    held = [r for r in rows if "eval/held/reward_mean" in r]
    assert [r["step"] for r in held] == [0, 2]
    for row in held:
        assert row["eval/held/records"] == 8 and 0 <= row["eval/held/answer_match_mean"] <= 1
        assert math.isfinite(row["eval/held/reward_mean"])
    _assert_trained(run, [r for r in rows if r["step"] > 0], warm_start["model"])


def test_train_on_answer_records_with_images(warm_start, answer_records):
    """Every micro-batch of two holds a text-only and a pictured prompt (the shared-prefix pass carries the
    pictured prompt's image alone)."""
    run, rows = _train_from_warm_start(warm_start, answer_records["mixed"], "grpo-mixed")
    _assert_trained(run, rows, warm_start["model"])


def _refused_train(answer_records, tiny_model_dir, tmp_path, capsys, **sections) -> str:
    """What ``train`` printed to stderr refusing a run on the text answer records (nothing made on disk)."""
    config = _write_config(
        tmp_path / "c.yaml", tiny_model_dir("qwen2_vl"), answer_records["text"], tmp_path / "run", **sections
    )
    capsys.readouterr()  # what building the tiny model printed
    assert cli_main(["train", "--config", str(config)]) == 1
    assert not (tmp_path / "run").exists()
    return capsys.readouterr().err


def test_a_coordinate_reward_on_answer_records_is_one_line_before_any_work(
    answer_records, tiny_model_dir, tmp_path, capsys
):
    rewards = {"weights": {"iou": 1.0, "format": 0.5}, "options": {}}
    err = _refused_train(answer_records, tiny_model_dir, tmp_path, capsys, rewards=rewards).strip()
    assert (
        err.count("\n") == 0
        and "rewards.weights.iou: scores image coordinates" in err
        and "answer_match" in err
    )


def test_answer_records_left_at_the_default_task_are_told_to_set_it(
    answer_records, tiny_model_dir, tmp_path, capsys
):
    """answer_match with data.task at its default (detection) on answer records: the fix, not "leave it out"."""
    err = _refused_train(answer_records, tiny_model_dir, tmp_path, capsys, data={"task": "detection"})
    assert err == (
        "vlm-grpoma train: error: data.task: is detection, but the training records are `answer` records (short "
        "text answers, what rewards.weights.answer_match scores); set data.task=answer\n"
    )


def test_reward_noise_flips_training_scores_only(warm_start, answer_records):
    """rewards.noise (the crossover experiment's control): the rollouts' answer_match scores are flipped about
    half the time at flip=0.5, the clean score is logged beside them, and held-out scoring stays clean."""
    run, rows = _train_from_warm_start(
        warm_start,
        answer_records["text"],
        "grpo-noisy",
        data={"eval_sets": {"held": str(answer_records["text"])}},
        rewards={"noise": {"flip": 0.5, "reward": "answer_match"}},
        train={"eval_every": 2},
    )
    trained = [r for r in rows if r["step"] > 0]
    flipped = sum(r["reward/noise/flipped_mean"] for r in trained) / len(trained)
    assert 0.3 < flipped < 0.7  # 2 steps x 32 answers at p = 0.5
    assert all(0 <= r["reward/answer_match/clean_mean"] <= 1 for r in trained)
    held = [r for r in rows if "eval/held/reward_mean" in r]
    assert held and not any(key.startswith("eval/held/noise") for r in held for key in r)
