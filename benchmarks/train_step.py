"""Training-pass cost of GRPO-MA trees: naive path log-probs vs the shared-prefix (packed) pass.

For T4A1, T4A4 and T16A1 it times one forward + backward of the thought and answer log-probs of a
micro-batch of prompts (the part of the update that depends on the tree's shape), with every thought and
answer at a fixed length so configurations do known, equal-per-token work, and reports the peak resident
memory growth over each measurement: Linux VmHWM minus VmRSS after resetting VmHWM through
/proc/self/clear_refs (not tracemalloc, which does not see torch's allocations). The script re-runs itself
with ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors go back to the system; otherwise glibc keeps
them and every measurement after the first reads close to 0. Presets: the tiny test model (16 image
tokens) and the larger ``bench`` model with a 448x448 image (256 image tokens). Example::

    .venv/bin/python benchmarks/train_step.py --presets tiny bench --prompts 2 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.models.base import PromptInputs, SpecialTokens
from vlm_grpoma.models.registry import load_model
from vlm_grpoma.models.tiny import build_tiny_model
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.logprobs import PathLogProbs, path_log_probs
from vlm_grpoma.trainer.packed import shared_prefix_log_probs

CONFIGS = ((4, 1), (4, 4), (16, 1))
#: preset -> image side in pixels (patch 14, merge 2: (side / 28)^2 image tokens)
IMAGE_SIDE = {"tiny": 112, "small": 112, "bench": 448}
LogProbFn = Callable[[torch.nn.Module, RolloutTree, list[int], SpecialTokens], PathLogProbs]
METHODS: dict[str, LogProbFn] = {"naive": path_log_probs, "shared": shared_prefix_log_probs}


def make_prompts(adapter, folder: Path, n: int, side: int) -> list[PromptInputs]:
    records = []
    for i in range(n):
        path = folder / f"{side}-{i}.png"
        Image.new("RGB", (side, side), (40 * i % 255, 120, 200)).save(path)
        records.append(Record(id=f"b{i}", image=str(path), task="detection", prompt="the blue square", width=side,
                              height=side, ground_truth=Boxes((Box(10, 10, 50, 50),))))
    return adapter.build_inputs(records)


def fixed_tree(prompts: list[PromptInputs], tokens: SpecialTokens, k: int, m: int, thought_len: int,
               answer_len: int, seed: int = 0) -> RolloutTree:
    """A K x M tree of random plain-text tokens, every thought and answer at its full length."""
    g = torch.Generator().manual_seed(seed)
    b = len(prompts)
    text = torch.arange(3, 200)  # plain tokens of the tiny BPE vocabularies (no special or vision ids)
    thoughts = text[torch.randint(len(text), (b, k, thought_len), generator=g)]
    answers = text[torch.randint(len(text), (b, k, m, answer_len), generator=g)]
    return RolloutTree(prompts, tokens.pad_id, thoughts, torch.ones_like(thoughts, dtype=torch.bool),
                       torch.zeros(thoughts.shape), [["stop"] * k] * b, [[""] * k] * b, answers,
                       torch.ones_like(answers, dtype=torch.bool), torch.zeros(answers.shape),
                       [[["stop"] * m] * k] * b, [[[""] * m] * k] * b)


def _rss_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def measure(fn: LogProbFn, model: torch.nn.Module, tree: RolloutTree, tokens: SpecialTokens,
            repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds (after one warm-up) and peak RSS growth in MiB of forward + backward."""
    times, peaks = [], []
    weights = None
    for rep in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        base = _rss_kib("VmRSS")
        start = time.perf_counter()
        logp = fn(model, tree, list(range(len(tree.prompts))), tokens)
        if weights is None:
            weights = (torch.randn(logp.thought.shape), torch.randn(logp.answer.shape))
        ((logp.thought * weights[0]).sum() + (logp.answer * weights[1]).sum()).backward()
        elapsed = time.perf_counter() - start
        if rep:
            times.append(elapsed)
            peaks.append((_rss_kib("VmHWM") - base) / 1024)
        del logp
    return {"seconds": min(times), "peak_mib": max(peaks)}


def bench_preset(preset: str, arch: str, args: argparse.Namespace, workdir: Path,
                 methods: dict[str, LogProbFn]) -> list[dict]:
    folder = build_tiny_model(arch, workdir / f"{arch}-{preset}", seed=0, preset=preset)
    side = IMAGE_SIDE[preset]
    loaded = load_model(ModelConfig(name_or_path=str(folder), dtype="float32", max_pixels=side * side))
    model, tokens = loaded.model.train(), loaded.adapter.tokens
    prompts = make_prompts(loaded.adapter, workdir, args.prompts, side)
    image_tokens = int((prompts[0].input_ids == tokens.image_id).sum())
    rows = []
    for k, m in CONFIGS:
        tree = fixed_tree(prompts, tokens, k, m, args.thought_len, args.answer_len)
        row = {"preset": preset, "image_tokens": image_tokens, "prompt_tokens": len(prompts[0].input_ids),
               "config": f"T{k}A{m}"}
        for name, fn in methods.items():
            for key, value in measure(fn, model, tree, tokens, args.repeats).items():
                row[f"{name}_{key}"] = value
        rows.append(row)
        print(f"  {preset} T{k}A{m}: " + ", ".join(f"{n} {row[f'{n}_seconds']:.3f}s" for n in methods), flush=True)
    return rows


def print_table(rows: list[dict], methods: list[str]) -> None:
    head = f"{'preset':7} {'img':>4} {'prompt':>6} {'config':7}"
    head += "".join(f" {n + ' s':>10} {n + ' MiB':>11}" for n in methods)
    head += "".join(f" {'naive/' + n:>13}" for n in methods if n != "naive")
    print(head)
    for r in rows:
        line = f"{r['preset']:7} {r['image_tokens']:4d} {r['prompt_tokens']:6d} {r['config']:7}"
        line += "".join(f" {r[n + '_seconds']:10.3f} {r[n + '_peak_mib']:11.1f}" for n in methods)
        line += "".join(f" {r['naive_seconds'] / r[n + '_seconds']:13.2f}" for n in methods if n != "naive")
        print(line)
    print("\nshape ratios (time of T4A4 over T4A1 and over T16A1, per method):")
    for preset in dict.fromkeys(r["preset"] for r in rows):
        by = {r["config"]: r for r in rows if r["preset"] == preset}
        for n in methods:
            t = {c: by[c][n + "_seconds"] for c in by}
            print(f"  {preset:7} {n:8} T4A4/T4A1 = {t['T4A4'] / t['T4A1']:.2f}   T4A4/T16A1 = {t['T4A4'] / t['T16A1']:.2f}")


# --- Full trainer step (rollout + rewards + update) and the TRL GRPOTrainer (M=1) comparison: added by the
# --- lead once trainer/loop.py lands (issue #7, third benchmark bullet). Not measured here yet.


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "bench"], choices=sorted(IMAGE_SIDE))
    parser.add_argument("--arch", default="qwen2_5_vl", choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
    parser.add_argument("--prompts", type=int, default=2, help="prompts per micro-batch")
    parser.add_argument("--thought-len", type=int, default=64)
    parser.add_argument("--answer-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # see the module docstring
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.arch == "qwen3_vl":
        IMAGE_SIDE.update({p: s * 16 // 14 for p, s in IMAGE_SIDE.items()})  # patch 16: same token counts
    with tempfile.TemporaryDirectory() as tmp:
        rows = [r for p in args.presets for r in bench_preset(p, args.arch, args, Path(tmp), METHODS)]
    print(f"\narch {args.arch}, {args.prompts} prompts per micro-batch, thought {args.thought_len} / answer "
          f"{args.answer_len} tokens, {args.threads} thread(s), best of {args.repeats}; MiB = peak RSS growth")
    print_table(rows, list(METHODS))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
