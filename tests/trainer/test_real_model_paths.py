"""What tiny models skip and real ones hit: LoRA with gradient checkpointing through the engine's own setup
(every family, images in the batch), a training step with the real 151,936-token vocabulary and tokenizer,
and the same step taken by two separate processes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.models.registry import load_adapter
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rewards.registry import register_reward, registered_rewards
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.engine import build_engine
from vlm_grpoma.trainer.packed import shared_prefix_log_probs

REPO = Path(__file__).resolve().parents[2]


class AnswerLength:
    """Longer answers score more: a reward that varies between a random model's samples."""

    def score(self, completions, records):
        return RewardResult([min(len(c.answer_text), 40) / 40 for c in completions])


if "test_real_answer_length" not in registered_rewards():
    register_reward("test_real_answer_length", AnswerLength)


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _tree(adapter, folder: Path) -> RolloutTree:
    """Two image prompts and a fixed K=2 x M=2 tree of plain text tokens."""
    records = []
    for i, (w, h) in enumerate([(84, 112), (112, 56)]):
        Image.effect_noise((w, h), 40 + 30 * i).convert("RGB").save(folder / f"{i}.png")
        records.append(
            Record(f"r{i}", str(folder / f"{i}.png"), "detection", "the cup", w, h, Boxes((Box(1, 1, 9, 9),)))
        )
    prompts = adapter.build_inputs(records)
    g = torch.Generator().manual_seed(0)
    close = torch.tensor(adapter.tokens.think_close)
    thoughts = torch.randint(3, 200, (2, 2, 6), generator=g)
    thoughts[..., -len(close) :] = close
    answers = torch.randint(3, 200, (2, 2, 2, 4), generator=g)
    ones = torch.ones
    return RolloutTree(
        prompts,
        adapter.tokens.pad_id,
        thoughts,
        ones(2, 2, 6, dtype=torch.bool),
        torch.zeros(2, 2, 6),
        [["stop"] * 2] * 2,
        [[""] * 2] * 2,
        answers,
        ones(2, 2, 2, 4, dtype=torch.bool),
        torch.zeros(2, 2, 2, 4),
        [[["stop"] * 2] * 2] * 2,
        [[[""] * 2] * 2] * 2,
    )


def _lora_steps(config, tree, adapter) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Two optimizer steps of an advantage-weighted log-likelihood through the engine; the gradients of each
    step and the final trainable parameters."""
    _seed(0)
    engine = build_engine(config)
    checkpointing = any(getattr(m, "gradient_checkpointing", False) for m in engine.module.modules())
    assert checkpointing is config.model.gradient_checkpointing
    weights = torch.linspace(-1, 1, 2 * 2 * 2 * 4).view(2, 2, 2, 4)
    grads = []
    for _ in range(2):
        logp = shared_prefix_log_probs(engine.deepspeed, tree, [0, 1], adapter.tokens)
        engine.backward(-(logp.answer * weights).sum() - logp.thought.sum() / 10)
        grads.append({n: p.grad.clone() for n, p in engine.module.named_parameters() if p.requires_grad})
        engine.step()
    params = {n: p.detach().clone() for n, p in engine.module.named_parameters() if p.requires_grad}
    engine.close()
    return grads, params


def test_gradient_checkpointing_with_lora_through_the_engine_changes_nothing(
    arch, make_config, tiny_model_dir, tmp_path
):
    """The engine's checkpointing (non-reentrant, frozen base, PEFT) gives the same gradients and update as
    no checkpointing, with images in the batch, for Qwen2-VL, Qwen2.5-VL and Qwen3-VL."""
    path = tiny_model_dir(arch)
    base = (
        f"model.name_or_path={path}",
        "model.lora.enabled=true",
        "model.lora.r=4",
        "model.lora.dropout=0.0",
        "train.prompts_per_step=2",
        "train.micro_batch_prompts=2",
        "optim.learning_rate=1e-2",
    )
    adapter = load_adapter(make_config(*base).model)
    tree = _tree(adapter, tmp_path)
    plain_grads, plain = _lora_steps(make_config(*base, "model.gradient_checkpointing=false"), tree, adapter)
    gc_grads, gc = _lora_steps(make_config(*base, "model.gradient_checkpointing=true"), tree, adapter)
    assert plain.keys() == gc.keys() and all(".lora_" in n for n in plain)
    for step in range(2):
        nonzero = [n for n, g in plain_grads[step].items() if g.abs().sum() > 0]
        # step 1: B is zero-initialised, so only B moves; step 2: every adapter weight has a gradient
        assert len(nonzero) == (len(plain) // 2 if step == 0 else len(plain)), step
        for name, grad in plain_grads[step].items():
            torch.testing.assert_close(gc_grads[step][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    for name, value in plain.items():
        torch.testing.assert_close(gc[name], value, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
def test_one_training_step_with_the_real_vocabulary_and_tokenizer(make_config, tiny_model_dir, tmp_path):
    """A 2-layer model with the real 151,936-row embedding and Qwen2 tokenizer: sampling over the full
    vocabulary, tags split into several tokens, the packed pass and the update all work."""
    from vlm_grpoma.models.qwen_vocab import wheel_path
    from vlm_grpoma.models.tiny import build_tiny_model
    from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

    if not wheel_path().is_file():
        pytest.skip(
            f"{wheel_path()} is absent: `make setup` downloads the dashscope wheel that holds qwen.tiktoken"
        )
    path = build_tiny_model("qwen2_vl", tmp_path / "model", preset="tiny", real_vocab=True)
    data = generate_shapes("detection", 2, tmp_path / "data", seed=0, config=EASY)
    trainer = GRPOMATrainer(
        make_config(
            f"model.name_or_path={path}",
            f"data.train_path={data}",
            f"logging.output_dir={tmp_path / 'run'}",
            "model.lora.enabled=true",
            "model.lora.r=4",
            "rewards.weights={test_real_answer_length: 1.0}",
            "train.steps=1",
            "train.prompts_per_step=2",
            "train.micro_batch_prompts=2",
            "rollout.num_thoughts=2",
            "rollout.answers_per_thought=2",
            "rollout.max_thought_tokens=6",
            "rollout.max_answer_tokens=6",
            "optim.learning_rate=1e-2",
        )
    )
    embedding = trainer.engine.module.get_input_embeddings().weight
    assert embedding.shape[0] == 151936 and len(trainer.adapter.tokenizer) == 151657
    assert len(trainer.adapter.tokens.think_close) > 1  # "</think>" is several real tokens
    before = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters() if p.requires_grad}
    metrics = trainer.train_step()
    assert all(np.isfinite(v) for k, v in metrics.items() if k.startswith(("loss/", "train/grad")))
    assert metrics["train/grad_norm"] > 0 and metrics["train/skipped_steps"] == 0
    assert metrics["rollout/logp_mismatch_max"] < 1e-4  # sampling and training agree over 151,936 logits
    after = dict(trainer.engine.module.named_parameters())
    assert any(not torch.equal(after[n], v) for n, v in before.items())
    trainer.engine.close()


@pytest.mark.slow
def test_the_same_seed_gives_the_same_step_in_two_processes(tiny_model_dir, tmp_path):
    """``vlm-grpoma train`` run twice as separate processes (same machine, same thread count): the sampled
    tree, the metrics and the trained weights are bit-identical."""
    path = tiny_model_dir("qwen2_5_vl")
    data = generate_shapes("detection", 4, tmp_path / "data", seed=0, config=EASY)
    # this process's group
    rank_variables = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    env = {k: v for k, v in os.environ.items() if k not in rank_variables}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        # the CLI, with this module imported first so its varying reward is registered
        script = (
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_real_model_paths; "
            "from vlm_grpoma.cli import main; sys.exit(main(sys.argv[1:]))"
        )
        command = [
            sys.executable,
            "-c",
            script,
            "train",
            "--config",
            str(REPO / "vlm_grpoma" / "configs" / "demo_detection.yaml"),
            f"model.name_or_path={path}",
            f"data.train_path={data}",
            f"logging.output_dir={out}",
            "logging.progress_bar=false",
            "logging.tensorboard=false",
            "train.steps=1",
            "train.prompts_per_step=4",
            "train.micro_batch_prompts=2",
            "rollout.max_thought_tokens=8",
            "rollout.max_answer_tokens=8",
            "rewards.weights={test_real_answer_length: 1.0}",
        ]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        runs.append(out)
    metrics = [json.loads((out / "metrics.jsonl").read_text().splitlines()[-1]) for out in runs]
    for key in metrics[0]:
        if not key.startswith(("time/", "tokens_per_s")):
            assert metrics[0][key] == metrics[1][key], key
    assert metrics[0]["train/grad_norm"] > 0
    from safetensors.torch import load_file

    a, b = (load_file(out / "checkpoints" / "step-00000001" / "model" / "model.safetensors") for out in runs)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
