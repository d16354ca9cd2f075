"""Text-only ``answer`` records through every Qwen-VL family's adapter (real tiny processors): no image in the
messages or inputs, no vision placeholder in the prompt, and text answers parsed and formatted back."""

from __future__ import annotations

from vlm_grpoma.answers import ParseError, TextAnswer
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.models.registry import load_adapter

RECORD = Record("t0", None, "answer", "What is 7 * 8?", None, None, ShortAnswer("56", "numeric"))


def test_text_only_record_builds_a_prompt_without_an_image_in_every_family(tiny_model_dir, arch):
    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir(arch))))
    messages = adapter.messages(RECORD)
    assert all(part["type"] == "text" for m in messages for part in m["content"])
    (inputs,) = adapter.build_inputs([RECORD])
    assert inputs.images == () and inputs.pixel_values is None and inputs.image_grid_thw is None
    assert "What is 7 * 8?" in inputs.text and "<|vision_start|>" not in inputs.text
    assert "Answer with the final answer alone" in inputs.text
    assert adapter.tokenizer.decode(inputs.input_ids) == inputs.text
    assert adapter.parse_answer("<think>7*8=56</think><answer>56</answer>", RECORD) == TextAnswer("56")
    assert isinstance(adapter.parse_answer("<answer></answer>", RECORD), ParseError)
    assert adapter.format_answer(TextAnswer("56"), RECORD) == "56"
