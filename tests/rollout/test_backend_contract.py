"""One contract for every rollout backend, on real small checkpoints of each Qwen-VL family.

The transformers backend runs everywhere; the vLLM backends (colocated, and a rollout server in its own process
with the weights pushed over HTTP) run wherever vLLM is importable (``make test-vllm`` runs them on CPU with
vllm-cpu in ``.venv-vllm``; the ``vllm`` marker selects them) and are skipped with that reason elsewhere. Backend-specific internals are tested elsewhere (``test_rollout_hf.py``, ``test_vllm_cpu_side.py``);
here only what the trainer relies on: the K x M tree's shapes, stop handling, truncation flags, banned vision
tokens, seeded determinism, log-probs equal to a teacher-forced forward (``trainer/logprobs.path_log_probs``,
an independent implementation), and samples that follow the weights after ``update_weights``.
The ``small`` preset (head_dim 32): vLLM's CPU attention has no kernel for the ``tiny`` preset's head_dim 16.

Stops must happen often for these checks to bite, and neither backend takes a logit bias, so a second
checkpoint is edited so that its next-token distribution is (nearly) a fixed, chosen one: every embedding row
gets a large shared first coordinate ``C`` and the final norm keeps only that coordinate, so the logit of
token ``t`` is ``E[t, 0] = C + boost[t]`` whatever the context. It is a real checkpoint both backends load.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from tests.rollout.server_process import ServerProcess, start_server
from vlm_grpoma.algorithm.diagnostics import logprob_mismatch
from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import Config, ModelConfig, RolloutConfig
from vlm_grpoma.datasets.schema import Record, Video, with_images
from vlm_grpoma.models.families import ARCHS
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.backends import build_rollout_engine
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.logprobs import path_log_probs

BACKENDS = ("hf", "vllm", "vllm_server")
#: |Δ log p| allowed against the teacher-forced forward, both sides in float32. hf: the same kernels, only the
#: batch layout differs. vLLM: its own attention and GEMM kernels sum in another order; on CPU the measured
#: maximum is ~2e-6 (1e-4 leaves room for other CPUs' vector widths); on CUDA (not yet run) TF32 matmuls and
#: other attention kernels are expected to cost more, hence 5e-3 there.
TOLERANCE = {"hf": 1e-4, "vllm-cpu": 1e-4, "vllm-cuda": 5e-3}
SHARED, TAG_BOOST, VISION_BOOST = 50.0, 5.25, 9.0
PRESET = "small"
MAX_IMAGES = 2
MAX_VIDEO_FRAMES = 4


def vllm_skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment (`make test-vllm` runs these tests in .venv-vllm)"
    return None


def vllm_test_options():
    """Engine options for tests: float32 like the reference forward, eager, a small KV cache and context."""
    from vlm_grpoma.rollout.vllm import VLLMOptions

    return VLLMOptions(
        gpu_memory_utilization=0.1, dtype="float32", enforce_eager=True, kv_cache_gib=0.25, max_model_len=1024
    )


def tolerance(backend: str, engine) -> float:
    return TOLERANCE[backend if backend == "hf" else f"vllm-{engine.device}"]  # a server: its own device


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
    """A one-image prompt and one with a video (3 frames) and two images (a second view of another size first,
    the target second), so every check below holds with several images and a video per prompt too."""
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
    Image.new("RGB", (72, 56), (200, 40, 40)).save(folder / "view.png")
    frames = []
    for i in range(3):
        frames.append(str(folder / f"frame{i}.png"))
        Image.new("RGB", (64, 48), (30 * i, 60, 200 - 30 * i)).save(frames[-1])
    out[1] = with_images(out[1], (str(folder / "view.png"), out[1].image), target_image=1)
    out[1] = replace(out[1], video=Video(tuple(frames), fps=2.0))
    return out


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((b, a), marks=[pytest.mark.vllm] if b != "hf" else [], id=f"{b}-{a}")
        for b in BACKENDS
        for a in ARCHS
    ],
)
def setup(request, tiny_model_dir, tmp_path_factory, records):
    """(engine factory, loaded model, prompts) for one backend and family; ``make(kind)``: plain or tagged."""
    backend, arch = request.param
    if backend != "hf" and (reason := vllm_skip_reason()):
        pytest.skip(reason)
    torch.set_num_threads(1)
    plain = tiny_model_dir(arch, PRESET)
    built: dict[str, tuple] = {}
    servers: list[ServerProcess] = []

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
            model_cfg = ModelConfig(
                name_or_path=str(folder),
                dtype="float32",
                max_pixels=112 * 112,
                max_images=MAX_IMAGES,
                max_video_frames=MAX_VIDEO_FRAMES,
            )
            loaded = load_model(model_cfg)
            loaded.model.eval()
            options = vllm_test_options() if backend == "vllm" else None
            rollout = RolloutConfig(backend=backend)
            if backend == "vllm_server":  # a server on the same checkpoint, in its own process
                log = tmp_path_factory.mktemp(f"server-{arch}-{kind}") / "server.log"
                servers.append(
                    start_server(
                        folder,
                        log,
                        "model.max_pixels=12544",
                        f"model.max_images={MAX_IMAGES}",
                        f"model.max_video_frames={MAX_VIDEO_FRAMES}",
                    )
                )
                rollout.server.urls = [servers[-1].url]
            config = Config(model=model_cfg, rollout=rollout)
            engine = build_rollout_engine(config, loaded.model, loaded.adapter, vllm_options_override=options)
            built[kind] = (engine, loaded.model, loaded.adapter, loaded.adapter.build_inputs(records))
        return built[kind]

    yield backend, make
    for server in servers:
        server.stop()
    built.clear()  # free this family's engines before the next family builds its own
    gc.collect()


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


def teacher_forced_mismatch(model, tree, adapter):
    """|rollout - teacher-forced| log-probs of every sampled and forced token of ``tree`` under ``model``."""
    with torch.no_grad():
        forced = path_log_probs(model, tree, list(range(len(tree.prompts))), adapter.tokens)
    return logprob_mismatch(
        [
            (forced.thought, tree.thought_logprobs, tree.thought_mask),
            (forced.answer, tree.answer_logprobs, tree.answer_mask),
        ]
    )


def test_logprobs_equal_teacher_forced_forward(setup):
    backend, make = setup
    engine, model, adapter, prompts = make("plain")
    # every thought truncated: the forced </think> is scored too
    params = SamplingParams(
        num_thoughts=2,
        answers_per_thought=2,
        max_thought_tokens=7,
        max_answer_tokens=5,
        seed=2,
        ignore_stop=True,
    )
    tree = engine.sample(prompts, params)
    mismatch = teacher_forced_mismatch(model, tree, adapter)
    assert mismatch.tokens == int(tree.thought_mask.sum() + tree.answer_mask.sum())
    assert mismatch.max_abs < tolerance(backend, engine), mismatch


def test_extra_answers_after_the_thoughts_ragged_and_teacher_forced(setup):
    """sample_answers (adaptive answers): counts[b, k] answers after thought (b, k), none elsewhere, ending
    like phase-2 answers; merged after the first answers their log-probs are the teacher-forced ones of the
    ragged tree, and the same seed gives the same extra answers (what an exact resume needs)."""
    backend, make = setup
    engine, model, adapter, prompts = make("tagged")
    params = SamplingParams(
        num_thoughts=3, answers_per_thought=2, max_thought_tokens=10, max_answer_tokens=6, seed=3
    )
    tree = engine.sample(prompts, params)
    counts = torch.tensor([[0, 3, 1], [2, 0, 1]])
    extra = engine.sample_answers(tree, counts, params)
    assert extra.shape == (2, 3, 3) and torch.equal(extra.answer_counts, counts)
    assert torch.equal(extra.answer_lengths > 0, extra.present)
    assert torch.equal(extra.thought_ids, tree.thought_ids)
    for b in range(2):
        for k in range(3):
            for m in range(3):
                text, finish = extra.answer_texts[b][k][m], extra.answer_finish[b][k][m]
                if extra.present[b, k, m]:
                    assert finish == "stop" if "</answer>" in text else finish in ("stop", "length")
                else:
                    assert (text, finish) == ("", "stop")
    merged = tree.with_answers(extra, width=5)
    assert torch.equal(merged.answer_counts, counts + 2)
    mismatch = teacher_forced_mismatch(model, merged, adapter)
    assert mismatch.tokens == int(merged.thought_mask.sum() + merged.answer_mask.sum())
    assert mismatch.max_abs < tolerance(backend, engine), mismatch
    again = engine.sample_answers(tree, counts, params)
    assert torch.equal(again.answer_ids, extra.answer_ids)


def test_samples_follow_the_weights_after_update_weights(setup):
    """Perturb every weight (the embedding too, which the output layer shares) as an optimizer step would,
    ``update_weights``, sample the same prompts again: the log-probs are the perturbed model's. The first
    rollout filled every cache (prefix KV blocks, image embeddings), so a cache that survived the update, or an
    output layer still computing from the old embedding, shows up as a mismatch (each was checked to fail this
    test when left out). The noise (std 0.01, half the weights' own) stays small enough that attention still
    matters: a much larger embedding noise would swamp it and hide a stale prefix. Restoring the weights and updating again gives the first tree back."""
    backend, make = setup
    engine, model, adapter, prompts = make("plain")
    params = SamplingParams(
        num_thoughts=2,
        answers_per_thought=2,
        max_thought_tokens=7,
        max_answer_tokens=5,
        seed=5,
        ignore_stop=True,
    )
    before = engine.sample(prompts, params)
    original = {name: param.detach().clone() for name, param in model.named_parameters()}
    noise = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.01 * torch.randn(param.shape, generator=noise))
        written = engine.update_weights(model)
        after = engine.sample(prompts, params)
        followed = teacher_forced_mismatch(model, after, adapter)
    finally:
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(original[name])
        engine.update_weights(model)
    assert written == (0 if backend == "hf" else len(original))  # hf samples from the live module itself
    assert followed.max_abs < tolerance(backend, engine), followed
    stale = teacher_forced_mismatch(model, after, adapter)  # the same tokens under the old weights
    assert stale.mean_abs > 0.1, "the perturbation must change the log-probs, or this test could not fail"
    again = engine.sample(prompts, params)
    assert torch.equal(again.thought_ids, before.thought_ids) and torch.equal(
        again.answer_ids, before.answer_ids
    )
    torch.testing.assert_close(
        again.answer_logprobs, before.answer_logprobs, atol=tolerance(backend, engine), rtol=0
    )
