"""HF rollout on text-only ``answer`` prompts, alone and batched with an image prompt, in every family: the
log-probs recorded while sampling equal one teacher-forced forward of the same rows (no pixel inputs)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from tree_segments import answer_segments  # tests/rollout/tree_segments.py

from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.models.base import collate
from vlm_grpoma.models.families import ARCHS
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.vllm.requests import RequestBuilder
from vlm_grpoma.sampling import SamplingParams


@pytest.mark.parametrize("arch", ARCHS)
def test_text_only_and_mixed_prompts_sample_with_teacher_forced_logprobs(arch, tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    loaded = load_model(
        ModelConfig(name_or_path=str(tiny_model_dir(arch)), dtype="float32", max_pixels=112 * 112)
    )
    model, adapter = loaded.model.eval(), loaded.adapter
    Image.new("RGB", (60, 40), (10, 200, 90)).save(tmp_path / "x.png")
    text = Record("t", None, "answer", "What is 2+3?", None, None, ShortAnswer("5"))
    pictured = Record("p", str(tmp_path / "x.png"), "answer", "How many squares?", 60, 40, ShortAnswer("1"))
    prompts = adapter.build_inputs([text, pictured])
    assert prompts[0].pixel_values is None and prompts[1].pixel_values is not None
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=1, max_thought_tokens=6, max_answer_tokens=4, seed=1
    )
    tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    assert tree.shape == (2, 2, 1)
    rows, owners, spans = [], [], []
    for seg in answer_segments(tree):
        thought = tree.thought_tokens(seg.prompt_index, seg.thought_index)
        rows.append(torch.cat([seg.context, seg.tokens]).tolist())
        owners.append(seg.prompt_index)
        spans.append((len(prompts[seg.prompt_index].input_ids), thought, seg))
    for only_text in (True, False):  # text rows alone (no pixel inputs at all), then every row
        keep = [i for i, o in enumerate(owners) if o == 0 or not only_text]
        batch = collate(prompts, [rows[i] for i in keep], [owners[i] for i in keep], adapter.tokens)
        assert ("pixel_values" in batch) is not only_text
        with torch.no_grad():
            logp = model(**batch).logits.float().log_softmax(-1)
        width = batch["input_ids"].shape[1]
        for j, i in enumerate(keep):
            n_prompt, thought, seg = spans[i]
            start = width - len(rows[i]) + n_prompt
            targets = torch.cat([thought, seg.tokens])
            ref = logp[j, start - 1 : start - 1 + len(targets)].gather(-1, targets[:, None]).squeeze(1)
            got = torch.cat(
                [tree.thought_logprobs[seg.prompt_index, seg.thought_index][: len(thought)], seg.logprobs]
            )
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_vllm_request_for_a_text_only_prompt_has_no_multi_modal_data(tiny_model_dir):
    adapter = load_model(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_vl")), dtype="float32")).adapter
    prompts = adapter.build_inputs(
        [Record("t", None, "answer", "What is 2+3?", None, None, ShortAnswer("5"))]
    )
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=1, max_thought_tokens=6, max_answer_tokens=4, seed=1
    )
    (request,) = RequestBuilder.for_adapter(adapter).thoughts(prompts, [3], params)
    assert request.images == ()
    assert request.prompt() == {"prompt_token_ids": prompts[0].input_ids.tolist()}
