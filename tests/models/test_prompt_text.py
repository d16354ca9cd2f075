"""``data.prompt_template`` and ``data.system_prompt``: the lead replaced per task from the record's fields, the
answer shape and frame kept, the system instruction replaced, and every mistake one line naming the key or
record."""

from __future__ import annotations

import pytest
from PIL import Image

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import ModelConfig, load_config, validate
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.errors import ConfigError, DataError
from vlm_grpoma.models.prompts import PromptText, prompt_text, task_instruction
from vlm_grpoma.models.registry import load_adapter


def _record(tmp_path, **meta) -> Record:
    Image.new("RGB", (120, 90), (200, 30, 30)).save(tmp_path / "r.png")
    return Record(
        id="rec-3",
        image=str(tmp_path / "r.png"),
        task="detection",
        prompt="  the red square ",
        width=120,
        height=90,
        ground_truth=Boxes((Box(1, 1, 5, 5),)),
        split="val",
        meta=meta,
    )


def _texts(messages) -> list[str]:
    return [part["text"] for m in messages for part in m["content"] if part["type"] == "text"]


def test_the_template_replaces_the_lead_and_the_system_prompt_replaces_ours(tmp_path, tiny_model_dir):
    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_vl"))))
    record = _record(tmp_path, colour="red")
    system, default = _texts(adapter.messages(record))
    assert default.startswith("Find the red square. Answer with a list of boxes")
    config = load_config(
        None,
        [
            'data.prompt_template={detection: "In this {width}x{height} {split} image ({colour}), locate {prompt}."}',
            "data.system_prompt=Think, then answer.",
        ],
    )
    validate(config)
    adapter.prompt_text = prompt_text(config.data)
    new_system, text = _texts(adapter.messages(record))
    assert new_system == "Think, then answer." and system != new_system
    lead = "In this 120x90 val image (red), locate the red square."
    assert text == default.replace("Find the red square.", lead)  # answer shape and frame unchanged
    other = Record(**{**record.__dict__, "task": "affordance"})
    assert _texts(adapter.messages(other))[1].startswith("Point to where to act: the red square.")


def test_an_answer_template_leads_a_text_only_prompt(tiny_model_dir):
    """``data.prompt_template.answer`` (accepted since data.task=answer trains) replaces the lead of a short-answer
    record; the answer instruction stays and no coordinate frame is stated."""
    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_vl"))))
    record = Record("q1", None, "answer", "7 +5", None, None, ShortAnswer("12"), meta={"steps": 1})
    default = _texts(adapter.messages(record))[1]
    assert default.startswith("Solve: 7 +5. Answer with the final answer alone")
    config = load_config(None, ['data.prompt_template={answer: "Work out {prompt} in {steps} step."}'])
    validate(config)
    adapter.prompt_text = prompt_text(config.data)
    text = _texts(adapter.messages(record))[1]
    assert text == default.replace("Solve: 7 +5.", "Work out 7 +5 in 1 step.") and "pixels" not in text


def test_a_field_the_record_lacks_names_the_record_and_key(tmp_path):
    from vlm_grpoma.models.families import FAMILIES

    record = _record(tmp_path)
    frame = next(iter(FAMILIES.values())).frame_spec
    with pytest.raises(
        DataError, match=r"^data\.prompt_template\.detection: names \{colour\}, which record rec-3"
    ):
        task_instruction(record, frame, 100, 100, template="{prompt} in {colour}")
    assert PromptText().templates == {} and PromptText().system == ""


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('data.prompt_template={detect: "x {prompt}"}', r"^data\.prompt_template: detect: is not a task"),
        (
            'data.prompt_template={detection: "{prompt.upper}"}',
            r"field \{prompt\.upper\}: name a record field",
        ),
        ('data.prompt_template={detection: "{prompt"}', r"is not a str\.format template"),
        ('data.prompt_template={detection: "  "}', r"is empty"),
    ],
)
def test_a_bad_template_is_one_line_before_anything_loads(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(load_config(None, [override]))
