"""The user's journey on the tiny model, every step a ``vlm-grpoma`` command as the README gives it: own
JSONL records and images -> ``check-data`` -> SFT with LoRA -> GRPO-MA with LoRA from the SFT adapter and a
reward function in the user's own file -> ``eval`` and ``manip-eval`` of the LoRA checkpoint, which find the
run's saved config by themselves."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import yaml
from PIL import Image, ImageDraw

from vlm_grpoma.cli import main as cli_main

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 170, 60)}

REWARD_FILE = textwrap.dedent(
    '''
    from vlm_grpoma.answers import Boxes


    def one_box(completion, record, bonus=1.0):
        """bonus when the answer is exactly one box (our prompts each name one object)."""
        answer = completion.answer
        return bonus if isinstance(answer, Boxes) and len(answer.boxes) == 1 else 0.0
    '''
)


def write_own_dataset(folder):
    """What a user brings: their own images and one JSONL file of records with train and test splits."""
    (folder / "photos").mkdir(parents=True)
    lines = []
    for i in range(12):
        colour = list(COLOURS)[i % 3]
        x, y, w, h = 8 + 7 * i, 10 + 5 * (i % 4), 30, 24
        image = Image.new("RGB", (128, 96), (235, 235, 225))
        ImageDraw.Draw(image).rectangle([x, y, x + w - 1, y + h - 1], fill=COLOURS[colour])
        image.save(folder / "photos" / f"img{i:02d}.jpg", quality=95)
        lines.append(
            {
                "id": f"own-{i:02d}",
                "image": f"photos/img{i:02d}.jpg",
                "task": "detection",
                "prompt": f"the {colour} rectangle",
                "width": 128,
                "height": 96,
                "split": "train" if i < 8 else "test",
                "ground_truth": {
                    "boxes": [{"bbox_2d": [x, y, x + w, y + h], "label": f"{colour} rectangle"}]
                },
            }
        )
    path = folder / "records.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.slow
def test_own_data_to_lora_checkpoint_evaluated_with_its_saved_config(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    from vlm_grpoma.envs.sapien.vulkan import rendering_status

    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)  # relative paths below are the user's, as in the README
    records = write_own_dataset(tmp_path / "mydata")
    tiny = tiny_model_dir("qwen2_5_vl")
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "one_box.py").write_text(REWARD_FILE)
    (tmp_path / "run.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {
                    "name_or_path": str(tiny),
                    "dtype": "float32",
                    "max_pixels": 128 * 96,
                    "prompt_style": "compact",
                    "lora": {"enabled": True, "r": 8, "alpha": 16},
                },
                "data": {"train_path": "mydata/records.jsonl", "eval_path": "mydata/records.jsonl"},
                "rollout": {
                    "num_thoughts": 2,
                    "answers_per_thought": 2,
                    "max_thought_tokens": 8,
                    "max_answer_tokens": 24,
                },
                "algorithm": {"kl_beta": 0.0},
                "optim": {"learning_rate": 1e-3},
                "train": {"steps": 2, "prompts_per_step": 2, "micro_batch_prompts": 2},
                "deepspeed": {"zero_stage": 0},
                "logging": {"progress_bar": False, "samples_every": 1, "samples": 3},
            }
        )
    )

    # 1. check the data: counts per split, image sizes, prompt tokens for this model's processor
    capsys.readouterr()
    assert cli_main(["check-data", str(records), "--config", "run.yaml"]) == 0
    out = capsys.readouterr().out
    assert "records: 12 valid of 12 read, 0 with errors" in out
    assert "detection/train: 8" in out and "detection/test: 4" in out
    assert "images: 12 distinct; width 128-128, height 96-96" in out and "prompt tokens for" in out

    # 2. SFT warm start with LoRA: the checkpoint's model/ holds only the adapter
    assert cli_main(["sft", "--config", "run.yaml", "logging.output_dir=runs/sft", "train.steps=3"]) == 0
    sft_model = tmp_path / "runs" / "sft" / "checkpoints" / "step-00000003" / "model"
    assert (sft_model / "adapter_config.json").is_file() and not (sft_model / "config.json").exists()

    # 3. GRPO-MA with LoRA, starting from the SFT adapter, with the user's reward function
    custom = "rewards/one_box.py:one_box"
    grpo_args = [
        "train",
        "--config",
        "run.yaml",
        f"model.name_or_path={sft_model.relative_to(tmp_path)}",
        f"rewards.weights={{iou: 1.0, format: 0.2, {custom}: 0.5}}",
        f"rewards.options={{{custom}: {{bonus: 2.0}}}}",
        "logging.output_dir=runs/grpo",
    ]
    assert cli_main(grpo_args) == 0
    run = tmp_path / "runs" / "grpo"
    grpo_model = run / "checkpoints" / "step-00000002" / "model"
    adapter_config = json.loads((grpo_model / "adapter_config.json").read_text())
    recorded = adapter_config["base_model_name_or_path"]  # relative to the adapter: the run may move
    assert not recorded.startswith("/") and (grpo_model / recorded).resolve() == sft_model.resolve()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(f"reward/{custom}_mean" in m for m in metrics)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 1, 2, 2, 2]
    for s in samples:  # each logged reward is the weighted sum of its logged components
        parts = s["rewards/iou"] + 0.2 * s["rewards/format"] + 0.5 * s[f"rewards/{custom}"]
        assert s["reward"] == pytest.approx(parts) and s[f"rewards/{custom}"] in (0.0, 2.0)
    assert (run / "config.yaml").is_file(), "the trainer saves its resolved config"

    # 4. eval of the LoRA checkpoint, given only the run folder: the saved config supplies the rest
    capsys.readouterr()
    assert cli_main(["eval", "--checkpoint", "runs/grpo"]) == 0
    out = capsys.readouterr().out
    assert f"config: {run.resolve() / 'config.yaml'} (the run's saved config)" in out
    assert f"(LoRA adapter on {tiny.resolve()}) on cpu" in out
    report = json.loads((run / "eval-test-step-2" / "metrics.json").read_text())
    assert report["split"] == "test" and report["records"] == 4  # the held-out split, by default
    assert (tmp_path / report["checkpoint"]).resolve() == grpo_model.resolve()

    # 5. manip-eval of the same checkpoint (a detection model: it answers, the simulator scores it)
    ok, reason = rendering_status(in_process=True)
    if not ok:
        pytest.skip(f"manip-eval needs rendering: {reason}")
    result_path = tmp_path / "manip.json"
    argv = ["manip-eval", "--policy", "model", "--checkpoint", str(grpo_model), "--split", "seen"]
    assert cli_main(argv + ["--episodes", "2", "--workers", "1", "--out", str(result_path)]) == 0
    out = capsys.readouterr().out
    assert "(the run's saved config)" in out and "LoRA adapter on" in out
    result = json.loads(result_path.read_text())
    assert result["aggregates"]["seen"]["episodes"] == 2 and result["policy"] == "model"
