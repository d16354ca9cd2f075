"""SFT targets in each family's frame, and the SFT run lowering the NLL of the ground-truth answers."""

from __future__ import annotations

import math

import pytest

from vlm_grpoma.answers import TextAnswer
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.models.families import ARCHS
from vlm_grpoma.models.registry import load_adapter
from vlm_grpoma.trainer.sft import SFTTrainer, reference_answer, target_text


@pytest.mark.parametrize("task", ["detection", "affordance", "trajectory"])
@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
def test_target_parses_back_to_the_ground_truth(task, arch, tiny_model_dir, tmp_path):
    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir(arch))))
    for record in read_records(generate_shapes(task, 3, tmp_path, seed=1)):
        text = target_text(adapter, record)
        assert text.startswith("<think>The target is near (") and text.endswith("</answer>")
        parsed = adapter.parse_answer(text, record)
        expected = reference_answer(record)
        assert type(parsed) is type(expected), text
        # model-frame integers: back in original pixels within one model unit
        tolerance = max(record.width, record.height) / 1000 + 1 if arch != "qwen2_5_vl" else 1.0
        for got, want in zip(_coords(parsed), _coords(expected)):
            assert abs(got - want) <= tolerance


def _coords(answer):
    if hasattr(answer, "boxes"):
        return [v for b in answer.boxes for v in (b.x1, b.y1, b.x2, b.y2)]
    return [v for point in answer.points for v in point]


@pytest.mark.parametrize("arch", ARCHS)
def test_answer_target_is_the_reference_thought_then_the_answer_text(arch, tiny_model_dir):
    """A short-answer record's target: its meta thought (else one naming the answer), then the answer itself,
    written as the model must (the prompt may have opened the thought) and parsed back to the ground truth."""
    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir(arch))))
    thought = adapter.thought
    truth = ShortAnswer("12", "numeric")
    stepwise = Record("a", None, "answer", "Compute: 7 +5", None, None, truth, meta={"thought": "7+5=12"})
    bare = Record("b", None, "answer", "Capital of France?", None, None, ShortAnswer("Paris"))
    assert target_text(adapter, stepwise) == thought.completion("7+5=12", "12")
    assert target_text(adapter, bare) == thought.completion("The answer is Paris.", "Paris")
    for record in (stepwise, bare):
        text = thought.full_text(target_text(adapter, record))
        assert text.startswith("<think>") and text.endswith(f"<answer>{record.ground_truth.answer}</answer>")
        assert (
            adapter.parse_answer(text, record)
            == reference_answer(record)
            == TextAnswer(record.ground_truth.answer)
        )


def test_affordance_reference_point_lies_in_the_mask(tmp_path):
    from vlm_grpoma.datasets.images import load_mask

    for record in read_records(generate_shapes("affordance", 4, tmp_path, seed=2)):
        ((x, y),) = reference_answer(record).points
        assert load_mask(record.ground_truth.path)[int(y), int(x)]


def test_sft_lowers_the_target_nll(make_config, tmp_path):
    data = generate_shapes("detection", 8, tmp_path / "data", seed=0, config=EASY)
    run = SFTTrainer(
        make_config(
            f"data.train_path={data}",
            "train.steps=12",
            "optim.learning_rate=3e-3",
            "data.shuffle=false",
            "train.prompts_per_step=8",
            "train.micro_batch_prompts=4",
        )
    )
    history = run.train()
    nll = [m["sft/nll"] for m in history]
    assert all(math.isfinite(v) for v in nll)
    assert nll[-1] < 0.6 * nll[0], nll
    assert (run.final_model_dir / "config.json").is_file()
