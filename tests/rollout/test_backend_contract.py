"""One contract for every rollout backend, on real tiny checkpoints of each Qwen-VL family.

The transformers backend runs everywhere; the vLLM backend runs only where CUDA and vLLM are importable and
is skipped otherwise with that reason. Backend-specific internals are tested elsewhere (``test_rollout_hf.py``,
``test_vllm_cpu_side.py``); here only what the trainer relies on: the K x M tree's shapes, stop handling,
truncation flags, banned vision tokens, seeded determinism, and log-probs equal to a teacher-forced forward
(``trainer/logprobs.path_log_probs``, an independent implementation).

Stops must happen often for these checks to bite, and neither backend takes a logit bias, so a second
checkpoint is edited so that its next-token distribution is (nearly) a fixed, chosen one: every embedding row
gets a large shared first coordinate ``C`` and the final norm keeps only that coordinate, so the logit of
token ``t`` is ``E[t, 0] = C + boost[t]`` whatever the context. It is a real checkpoint both backends load.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import Config, ModelConfig, RolloutConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.models.families import ARCHS
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.backends import build_rollout_engine, logprob_mismatch
from vlm_grpoma.rollout.engine import SamplingParams
from vlm_grpoma.trainer.logprobs import path_log_probs

BACKENDS = ("hf", "vllm")
#: |Δ log p| allowed against the teacher-forced forward (vLLM: other attention kernels, fp32 on GPU).
TOLERANCE = {"hf": 1e-4, "vllm": 5e-3}
SHARED, TAG_BOOST, VISION_BOOST = 50.0, 5.25, 9.0


def vllm_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "vLLM backend needs a CUDA GPU (torch.cuda.is_available() is False)"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM backend needs vllm (pip install 'vlm-grpoma[vllm]')"
    return None


def tagged_checkpoint(src: Path, dst: Path, boosts: dict[int, float]) -> Path:
    """A copy of ``src`` whose next-token logits are ``C + boosts.get(t, 0)`` for every context (see above)."""
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    state = load_file(path)
    embed = next(k for k in state if k.endswith("embed_tokens.weight"))  # legacy or current naming
    norm = next(k for k in state if k in ("model.norm.weight", "model.language_model.norm.weight"))
    table = state[embed].clone()
    table[:, 0] = SHARED
    for token, boost in boosts.items():
        table[token, 0] += boost
    weight = torch.zeros_like(state[norm])
    weight[0] = 1 / math.sqrt(weight.numel())  # normalised hidden state -> (1, 0, ..., 0)
    state[embed], state[norm] = table, weight
    save_file(state, path, metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[Record]:
    folder = tmp_path_factory.mktemp("contract-images")
    out = []
    for i, (w, h) in enumerate([(100, 80), (40, 150)]):
        path = folder / f"{i}.png"
        Image.new("RGB", (w, h), (60 * i, 200, 90)).save(path)
        out.append(
            Record(
                id=f"r{i}",
                image=str(path),
                task="detection",
                prompt="the green square",
                width=w,
                height=h,
                ground_truth=Boxes((Box(1, 1, 9, 9),)),
            )
        )
    return out


@pytest.fixture(
    scope="module", params=[(b, a) for b in BACKENDS for a in ARCHS], ids=lambda p: f"{p[0]}-{p[1]}"
)
def setup(request, tiny_model_dir, tmp_path_factory, records):
    """(engine factory, loaded model, prompts) for one backend and family; ``make(kind)``: plain or tagged."""
    backend, arch = request.param
    if backend == "vllm" and (reason := vllm_skip_reason()):
        pytest.skip(reason)
    torch.set_num_threads(1)
    plain = tiny_model_dir(arch)
    built: dict[str, tuple] = {}

    def make(kind: str):
        if kind not in built:
            folder = plain
            if kind == "tagged":
                probe = load_model(
                    ModelConfig(name_or_path=str(plain), dtype="float32", max_pixels=112 * 112)
                )
                tokens = probe.adapter.tokens
                boosts = {
                    tokens.think_close[-1]: TAG_BOOST,
                    tokens.answer_close[-1]: TAG_BOOST,
                    **dict.fromkeys(tokens.suppress_ids, VISION_BOOST),
                }
                folder = tagged_checkpoint(plain, tmp_path_factory.mktemp(f"tagged-{arch}") / "ckpt", boosts)
            model_cfg = ModelConfig(name_or_path=str(folder), dtype="float32", max_pixels=112 * 112)
            loaded = load_model(model_cfg)
            loaded.model.eval()
            options = None
            if backend == "vllm":
                from vlm_grpoma.rollout.vllm import VLLMOptions

                options = VLLMOptions(gpu_memory_utilization=0.1, dtype="float32", enforce_eager=True)
            config = Config(model=model_cfg, rollout=RolloutConfig(backend=backend))
            engine = build_rollout_engine(config, loaded.model, loaded.adapter, vllm_options=options)
            built[kind] = (engine, loaded.model, loaded.adapter, loaded.adapter.build_inputs(records))
        return built[kind]

    return backend, make


def test_tree_shapes_stop_handling_and_finish_reasons(setup):
    _, make = setup
    engine, _, adapter, prompts = make("tagged")
    params = SamplingParams(
        num_thoughts=6, answers_per_thought=3, max_thought_tokens=6, max_answer_tokens=5, seed=1
    )
    tree = engine.sample(prompts, params)
    close = torch.tensor(adapter.tokens.think_close)
    lt = params.max_thought_tokens + len(close)
    assert tree.shape == (2, 6, 3)
    assert tree.thought_ids.shape == tree.thought_mask.shape == tree.thought_logprobs.shape == (2, 6, lt)
    assert tree.answer_ids.shape == tree.answer_mask.shape == tree.answer_logprobs.shape == (2, 6, 3, 5)
    assert [len(r) for r in tree.thought_texts] == [6, 6] and all(
        len(a) == 3 for r in tree.answer_texts for a in r
    )
    for b in range(2):
        for k in range(6):
            ids = tree.thought_tokens(b, k)
            assert torch.equal(ids[-len(close) :], close)
            assert (
                tree.thought_texts[b][k].endswith("</think>")
                and tree.thought_texts[b][k].count("</think>") == 1
            )
            if tree.thought_finish[b][k] == "length":
                assert len(ids) == lt  # the budget, then the forced </think>
            for m in range(3):
                n, text = int(tree.answer_lengths[b, k, m]), tree.answer_texts[b][k][m]
                if tree.answer_finish[b][k][m] == "stop":
                    assert (
                        text.endswith("</answer>")
                        or int(tree.answer_ids[b, k, m, n - 1]) in adapter.tokens.eos_ids
                    )
                    assert text.count("</answer>") <= 1
                else:
                    assert n == params.max_answer_tokens and "</answer>" not in text
    for ids, mask in ((tree.thought_ids, tree.thought_mask), (tree.answer_ids, tree.answer_mask)):
        assert torch.equal(mask, torch.arange(mask.shape[-1]) < mask.sum(-1, keepdim=True))  # prefix masks
        assert (ids[~mask] == tree.pad_id).all() and (tree.thought_logprobs[~tree.thought_mask] == 0).all()
    assert {"stop", "length"} == {f for row in tree.thought_finish for f in row}
    assert "stop" in {f for row in tree.answer_finish for per in row for f in per}
    assert set(tree.seconds) and all(v >= 0 for v in tree.seconds.values())


def test_truncated_thoughts_are_closed_and_flagged(setup):
    _, make = setup
    engine, _, adapter, prompts = make("tagged")
    close = torch.tensor(adapter.tokens.think_close)
    params = SamplingParams(
        num_thoughts=2,
        answers_per_thought=2,
        max_thought_tokens=4,
        max_answer_tokens=3,
        seed=3,
        ignore_stop=True,
    )
    tree = engine.sample(prompts, params)
    assert tree.thought_truncated.all() and tree.answer_truncated.all()
    assert (tree.thought_lengths == 4 + len(close)).all() and (tree.answer_lengths == 3).all()
    assert (tree.thought_ids[..., -len(close) :] == close).all()
    # the forced </think> is scored by the model, not left at 0: its boosted logit makes it likelier than
    # an ordinary token, less likely than the (unsampled) vision tokens
    forced = tree.thought_logprobs[..., -1]
    assert (forced < -1).all() and (forced > tree.thought_logprobs[..., 0].min()).all()


def test_vision_tokens_are_never_sampled(setup):
    _, make = setup
    engine, _, adapter, prompts = make("tagged")  # vision tokens hold ~98% of the raw probability mass
    params = SamplingParams(
        num_thoughts=3, answers_per_thought=2, max_thought_tokens=8, max_answer_tokens=6, seed=4
    )
    tree = engine.sample(prompts, params)
    sampled = torch.cat([tree.thought_ids[tree.thought_mask], tree.answer_ids[tree.answer_mask]])
    assert not torch.isin(sampled, torch.tensor(adapter.tokens.suppress_ids)).any()
    # raw log-probs: the refused vision mass stays in the denominator
    assert tree.thought_logprobs[tree.thought_mask].max() < math.log(0.05)
    for text in (t for row in tree.thought_texts for t in row):
        assert "<|image_pad|>" not in text and "<|vision_start|>" not in text


def test_same_seed_same_tree_other_seed_differs(setup):
    _, make = setup
    engine, _, _, prompts = make("plain")
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=6, max_answer_tokens=4, seed=7
    )
    a, b = engine.sample(prompts, params), engine.sample(prompts, params)
    c = engine.sample(prompts, SamplingParams(**{**params.__dict__, "seed": 8}))
    assert torch.equal(a.thought_ids, b.thought_ids) and torch.equal(a.answer_ids, b.answer_ids)
    assert a.thought_finish == b.thought_finish and a.answer_texts == b.answer_texts
    assert not torch.equal(a.thought_ids, c.thought_ids)


def test_logprobs_equal_teacher_forced_forward(setup):
    backend, make = setup
    engine, model, adapter, prompts = make("plain")
    params = SamplingParams(
        num_thoughts=2,
        answers_per_thought=2,
        max_thought_tokens=7,
        max_answer_tokens=5,
        seed=2,
        ignore_stop=True,
    )  # every thought truncated: the forced </think> is scored too
    tree = engine.sample(prompts, params)
    with torch.no_grad():
        forced = path_log_probs(model, tree, [0, 1], adapter.tokens)
    mismatch = logprob_mismatch(
        [
            (forced.thought, tree.thought_logprobs, tree.thought_mask),
            (forced.answer, tree.answer_logprobs, tree.answer_mask),
        ]
    )
    assert mismatch.tokens == int(tree.thought_mask.sum() + tree.answer_mask.sum())
    assert mismatch.max_abs < TOLERANCE[backend], mismatch
