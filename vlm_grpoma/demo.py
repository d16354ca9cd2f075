"""``vlm-grpoma demo``: the GRPO-MA pipeline end to end on CPU, offline, in about a minute.

Until the trainer lands (issue #5) the demo runs everything a training step does before the update: it builds
a tiny Qwen2.5-VL model and a synthetic shapes detection set, samples K thoughts x M answers per prompt,
parses and scores every answer, and computes the thought and answer advantages. It says so plainly.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from vlm_grpoma.algorithm import grpo_ma_advantages, thought_advantage_variance
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.models.registry import load_model
from vlm_grpoma.models.tiny import build_tiny_model
from vlm_grpoma.rewards import Completion
from vlm_grpoma.rewards.base import build_rewards
from vlm_grpoma.rollout.engine import SamplingParams
from vlm_grpoma.rollout.hf import HFRolloutEngine

PROMPTS, THOUGHTS, ANSWERS = 4, 4, 4


def main(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    out = Path(args.out)
    start = time.perf_counter()
    model_dir = build_tiny_model("qwen2_5_vl", out / "model", seed=0, preset="small")
    records = read_records(generate_shapes("detection", PROMPTS, out / "data", seed=0, config=EASY))
    loaded = load_model(ModelConfig(name_or_path=str(model_dir), dtype="float32"))
    model, adapter = loaded.model.eval(), loaded.adapter
    print(f"built a tiny Qwen2.5-VL ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters) and "
          f"{len(records)} shapes detection records under {out} ({time.perf_counter() - start:.1f} s)")

    prompts = adapter.build_inputs(records)
    params = SamplingParams(num_thoughts=THOUGHTS, answers_per_thought=ANSWERS, temperature=1.0,
                            max_thought_tokens=48, max_answer_tokens=24, seed=0)
    tick = time.perf_counter()
    tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    rollout_s = time.perf_counter() - tick

    completions, flat_records = [], []
    for b, record in enumerate(records):
        for k in range(THOUGHTS):
            for m in range(ANSWERS):
                thought, answer = tree.thought_texts[b][k], tree.answer_texts[b][k][m]
                # Parse thought + answer: a real vocabulary can split the <answer> tag across the boundary.
                completions.append(Completion(adapter.parse_answer(thought + answer, record), thought, answer))
                flat_records.append(record)
    result = build_rewards({"iou": 1.0, "format": 0.5}).score(completions, flat_records)
    rewards = torch.tensor(result.total).view(PROMPTS, THOUGHTS, ANSWERS)
    thought_adv, answer_adv = grpo_ma_advantages(rewards)

    print(f"\nrollout T{THOUGHTS}A{ANSWERS}: {PROMPTS} prompts -> {rewards.numel()} answers in {rollout_s:.1f} s; "
          f"thought lengths {tree.thought_lengths.float().mean():.1f} tokens (truncated "
          f"{tree.thought_truncated.float().mean():.0%}), answers {tree.answer_lengths.float().mean():.1f} tokens")
    print(f"\n{'prompt':<34} {'reward mean':>11} {'format':>7} {'IoU':>6}   thought advantages")
    iou = torch.tensor(result.components["iou"]).view(PROMPTS, -1)
    fmt = torch.tensor(result.components["format"]).view(PROMPTS, -1)
    for b, record in enumerate(records):
        advs = " ".join(f"{a:+.2f}" for a in thought_adv[b].tolist())
        print(f"{record.prompt[:34]:<34} {rewards[b].mean():11.3f} {fmt[b].mean():7.2f} {iou[b].mean():6.3f}   {advs}")
    print(f"\nanswer advantages: mean {answer_adv.mean():+.3f}, std {answer_adv.std():.3f}; failures: "
          f"{dict(sorted(result.failures.items())) or 'none'}")
    variance = thought_advantage_variance(rewards)
    print(f"estimated thought-advantage variance from answer sampling: {variance.nanmean():.3f}")
    print("\nThe model is untrained, so rewards are near 0 and most groups have zero advantage (nothing to learn "
          "from yet).\nTraining — the SFT warm start and GRPO-MA updates on DeepSpeed — arrives with issue #5; "
          f"this demo stops after the advantages. Total {time.perf_counter() - start:.1f} s.")
    return 0
