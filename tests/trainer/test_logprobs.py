"""Teacher-forced path log-probs reproduce the log-probs recorded while sampling, for every family."""

import pytest
import torch
from PIL import Image

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.logprobs import path_log_probs, token_log_probs


def test_token_log_probs_equals_log_softmax_gather():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(11, (3, 5), generator=torch.Generator().manual_seed(1))
    expected = logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(token_log_probs(logits, targets), expected)


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_path_log_probs_match_sampling_log_probs(arch, tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    loaded = load_model(ModelConfig(name_or_path=str(tiny_model_dir(arch)), dtype="float32"))
    model, adapter = loaded.model.eval(), loaded.adapter
    records = []
    for i, (w, h) in enumerate([(90, 70), (50, 120)]):
        Image.new("RGB", (w, h), (40 * i, 120, 200)).save(tmp_path / f"{i}.png")
        records.append(
            Record(
                id=f"r{i}",
                image=str(tmp_path / f"{i}.png"),
                task="detection",
                prompt="the square",
                width=w,
                height=h,
                ground_truth=Boxes((Box(1, 1, 9, 9),)),
            )
        )
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=3, max_thought_tokens=7, max_answer_tokens=5, seed=3
    )
    tree = HFRolloutEngine.for_adapter(model, adapter).sample(adapter.build_inputs(records), params)

    with torch.no_grad():
        got = path_log_probs(model, tree, [0, 1], adapter.tokens)
        second = path_log_probs(model, tree, [1], adapter.tokens)
    torch.testing.assert_close(got.thought, tree.thought_logprobs * tree.thought_mask, atol=1e-4, rtol=0)
    torch.testing.assert_close(got.answer, tree.answer_logprobs * tree.answer_mask, atol=1e-4, rtol=0)
    torch.testing.assert_close(second.answer[0], got.answer[1], atol=1e-5, rtol=0)  # micro-batching is exact

    logp = path_log_probs(model, tree, [0], adapter.tokens)
    (logp.thought.sum() + logp.answer.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
