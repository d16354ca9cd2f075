"""Real model sizes: one GRPO-MA step of a random model of a released architecture, phase by phase, with its
time, its peak memory next to ``vlm-grpoma plan``'s estimate, and the checkpoint it writes.

The model is built from the shipped config values (``vlm_grpoma/models/architectures``: every layer, vision
tower and the 151,936-token embedding; ``--layers N`` keeps only N decoder layers) with the real Qwen2
tokenizer (``models/qwen_vocab.py``) and the checkpoint's pixel bounds; or it is a tiny preset (``--model tiny``
or ``bench``). The step is the real trainer's (``benchmarks/train_step.py``'s FixedLengthTrainer: every thought
and answer runs to its budget, so the work matches the plan's maxima) on synthetic shapes images, rewarded by
how many distinct characters an answer has (so a random model's advantages are not all zero).

Memory: on a GPU ``torch.cuda.max_memory_allocated`` per phase; on the CPU the growth of Linux VmHWM over the
resident size before the model existed (VmHWM reset through /proc/self/clear_refs at each phase; the script
re-runs itself with ``MALLOC_MMAP_THRESHOLD_=65536`` so freed tensors leave the process). The plan's estimate
for the same config (CPU: fp32, no CUDA reserve) is printed beside it with the error.

``--repeat N`` runs the whole measurement N times, each in a fresh process, and compares the steps bit for bit
(grad norm, loss, a hash of the trained parameters). Opt-in, not part of ``make test``::

    .venv/bin/python benchmarks/real_size.py --model Qwen2-VL-2B-Instruct            # ~11 GiB of RAM
    .venv/bin/python benchmarks/real_size.py --model Qwen2-VL-2B-Instruct --repeat 2
    .venv/bin/python benchmarks/real_size.py --model bench
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from train_step import FixedLengthTrainer, _rss_kib, shapes_records

from vlm_grpoma.config import load_config
from vlm_grpoma.models.architecture import architecture_names, load_architecture
from vlm_grpoma.models.tiny import PRESETS, build_processor, build_tiny_model
from vlm_grpoma.planning.memory import GIB, Hardware
from vlm_grpoma.planning.report import make_plan
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rewards.registry import register_reward
from vlm_grpoma.trainer.checkpoint import checkpoint_bytes
from vlm_grpoma.trainer.scoring import score_tree

MIB = 2**20


class TextVariety:
    """Distinct characters of an answer / 40: varies between a random model's samples (non-zero advantages)."""

    def score(self, completions, records):
        return RewardResult([min(len(set(c.answer_text)), 40) / 40 for c in completions])


register_reward("bench_text_variety", TextVariety)


class PeakMemory:
    """Per phase: the peak above a baseline taken before the model existed, and the growth above the phase's
    start. CUDA allocator statistics on a GPU, Linux VmHWM / VmRSS on the CPU."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self.baseline = self._current()

    def _current(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else _rss_kib("VmRSS") * 1024

    @contextmanager
    def phase(self, results: dict[str, dict[str, float]], name: str):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
        start, at_start = time.perf_counter(), self._current()
        yield
        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = _rss_kib("VmHWM") * 1024
        results[name] = {
            "seconds": time.perf_counter() - start,
            "peak_bytes": float(peak - self.baseline),
            "growth_bytes": float(peak - at_start),
        }


def build_model_folder(args: argparse.Namespace, folder: Path) -> tuple[Path, torch.nn.Module | None]:
    """A Hugging Face folder (config + processor; weights only for tiny presets) and, for a real architecture,
    the random model in memory (its weights are never written: 9 GB for 2B in fp32)."""
    if args.model in PRESETS:
        return build_tiny_model(args.arch, folder, preset=args.model), None
    from transformers import AutoModelForImageTextToText

    from vlm_grpoma.models.qwen_vocab import load_qwen_tokenizer

    arch = load_architecture(args.model)
    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    config = arch.transformers_config(**overrides)
    tokenizer = load_qwen_tokenizer("qwen2")
    tokenizer.pad_token = "<|endoftext|>"
    processor = build_processor(
        arch.model_type, tokenizer, arch.processor.min_pixels, arch.processor.max_pixels
    )
    config.save_pretrained(folder)
    processor.save_pretrained(folder)
    torch.manual_seed(args.seed)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    return folder, model


def run_config(args: argparse.Namespace, folder: Path, data: Path, out: Path):
    device_dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    return load_config(
        None,
        [
            f"model.name_or_path={folder}",
            f"model.dtype={device_dtype}",
            f"model.max_pixels={args.image * args.image}",
            f"model.gradient_checkpointing={str(not args.no_checkpointing).lower()}",
            f"model.lora.enabled={str(args.lora_r > 0).lower()}",
            f"model.lora.r={max(args.lora_r, 1)}",
            f"model.lora.alpha={2 * max(args.lora_r, 1)}",
            "model.lora.dropout=0.05",
            f"data.train_path={data}",
            f"logging.output_dir={out}",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
            "rewards.weights={bench_text_variety: 1.0}",
            f"rollout.num_thoughts={args.thoughts}",
            f"rollout.answers_per_thought={args.answers}",
            f"rollout.max_thought_tokens={args.thought_tokens}",
            f"rollout.max_answer_tokens={args.answer_tokens}",
            "algorithm.kl_beta=0",
            f"train.steps={args.steps}",
            f"train.prompts_per_step={args.prompts}",
            f"train.micro_batch_prompts={args.prompts}",
            "optim.learning_rate=1e-5",
            f"deepspeed.zero_stage={args.zero}",
            "checkpoint.keep_last=1",
            f"seed={args.seed}",
        ],
    )


def measure(args: argparse.Namespace) -> dict:
    """One measurement in this process: phases, plan estimates, checkpoint sizes, the step's fingerprint."""
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        data = shapes_records(tmp, args.image, args.prompts * args.steps)
        memory = PeakMemory()
        phases: dict[str, dict[str, float]] = {}
        with memory.phase(phases, "build model"):
            folder, model = build_model_folder(args, tmp / "model")
        config = run_config(args, folder, data, tmp / "run")
        with memory.phase(phases, "build engine"):
            trainer = FixedLengthTrainer(config, model=model)
        del model
        steps = []
        for _ in range(args.steps):  # GRPOMATrainer.train_step, phase by phase
            step: dict[str, dict[str, float]] = {}
            records = trainer.next_records()
            with memory.phase(step, "rollout"):
                tree = trainer._rollout(records)
            with memory.phase(step, "reward"):
                rewards = score_tree(tree, records, trainer.adapter, trainer.rewards).rewards
            with memory.phase(step, "update (log-probs, backward, optimizer)"):
                update, grad_norm = trainer._update(tree, trainer._targets(tree, rewards))
            trainer.step += 1
            steps.append({"phases": step, "grad_norm": grad_norm, "loss": update["loss/total"]})
        with memory.phase(phases, "save checkpoint"):
            saved = trainer.save()
        sizes = checkpoint_bytes(saved)
        trained = [p.detach().float().cpu() for p in trainer.engine.module.parameters() if p.requires_grad]
        digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in trained)).hexdigest()
        hardware = Hardware(1, 1, 1024, device="gpu" if torch.cuda.is_available() else "cpu")
        plan = make_plan(config, hardware).memory
        frozen = sum(
            p.numel() * p.element_size() for p in trainer.engine.module.parameters() if not p.requires_grad
        )
        trainer.engine.close()
    states = sum(plan.states.values())
    return {
        "model": args.model,
        "args": {k: v for k, v in vars(args).items() if isinstance(v, (bool, int, float, str))},
        "layers": args.layers,
        "trainable_parameters": sum(p.numel() for p in trained),
        "phases": phases,
        "steps": steps,
        "estimate": {  # peak above the baseline (states + the phase's part) and the phase's own part
            "rollout": (states + sum(plan.rollout.values()), sum(plan.rollout.values())),
            "update": (states + sum(plan.training_pass.values()), sum(plan.training_pass.values())),
        },
        "checkpoint": sizes,
        "frozen_bytes_not_saved": frozen,
        "fingerprint": digest,
    }


def _error(estimate: float, measured: float) -> str:
    return f"{100 * (estimate - measured) / measured:+.0f} %" if measured > 0 else "n/a"


def print_report(result: dict) -> None:
    print(f"model {result['model']}" + (f" ({result['layers']} decoder layers)" if result["layers"] else ""))
    print(
        f"{'phase':<40}{'s':>7}{'peak GiB':>10}{'plan':>8}{'error':>8}{'growth GiB':>12}{'plan':>8}{'error':>8}"
    )
    rows = list(result["phases"].items())[:2]
    rows += [(f"step {len(result['steps'])}: {n}", v) for n, v in result["steps"][-1]["phases"].items()]
    rows.append(("save checkpoint", result["phases"]["save checkpoint"]))
    for name, value in rows:
        key = "rollout" if name.endswith("rollout") else "update" if "update" in name else None
        line = f"{name[:39]:<40}{value['seconds']:7.1f}{value['peak_bytes'] / GIB:10.3f}"
        if key:
            total, part = result["estimate"][key]
            line += f"{total / GIB:8.3f}{_error(total, value['peak_bytes']):>8}"
            line += f"{value['growth_bytes'] / GIB:12.3f}{part / GIB:8.3f}{_error(part, value['growth_bytes']):>8}"
        else:
            line += f"{'':16}{value['growth_bytes'] / GIB:12.3f}"
        print(line)
    sizes = result["checkpoint"]
    print(
        f"checkpoint: total {sizes['total'] / GIB:.3f} GiB; model/ {sizes.get('model', 0) / GIB:.3f} GiB, "
        f"deepspeed/ {sizes.get('deepspeed', 0) / GIB:.3f} GiB; frozen parameters not saved: "
        f"{result['frozen_bytes_not_saved'] / GIB:.2f} GiB"
    )
    for i, step in enumerate(result["steps"], 1):
        print(f"step {i}: grad norm {step['grad_norm']:.6f}, loss {step['loss']:.6e}")
    print(
        f"trainable parameters {result['trainable_parameters']:,}; sha256 after the step {result['fingerprint'][:16]}"
    )


def _without_option(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option VALUE`` / ``option=VALUE``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", required=True, help=f"{', '.join(architecture_names())} or {', '.join(PRESETS)}"
    )
    parser.add_argument("--arch", default="qwen2_5_vl", help="family of a tiny preset")
    parser.add_argument("--layers", type=int, default=0, help="keep only this many decoder layers (0: all)")
    parser.add_argument("--lora-r", type=int, default=64, help="LoRA rank (0: full fine-tuning)")
    parser.add_argument("--zero", type=int, default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--image", type=int, default=448, help="image side in pixels (448: 256 image tokens)")
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--thoughts", type=int, default=2)
    parser.add_argument("--answers", type=int, default=2)
    parser.add_argument("--thought-tokens", type=int, default=32)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=1, help="measure N times, each in a fresh process")
    parser.add_argument("--json", type=Path, default=None, help="write the result(s) here")
    parser.add_argument("--workdir", default=None, help="temporary files go here (default: the system's)")
    args = parser.parse_args()
    if args.repeat > 1:
        results = []
        for i in range(args.repeat):
            child = _without_option(sys.argv[1:], "--repeat")
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                subprocess.run([sys.executable, __file__, *child, "--json", out.name], check=True)
                results.append(json.loads(Path(out.name).read_text()))
            print(f"(run {i + 1} of {args.repeat} done)", flush=True)
        same = {
            "fingerprint": len({r["fingerprint"] for r in results}) == 1,
            "grad_norm": len({json.dumps([s["grad_norm"] for s in r["steps"]]) for r in results}) == 1,
            "loss": len({json.dumps([s["loss"] for s in r["steps"]]) for r in results}) == 1,
        }
        print(
            f"{args.repeat} processes, same seed: "
            + ", ".join(f"{k} {'identical' if v else 'DIFFERENT'}" for k, v in same.items())
        )
        if args.json:
            args.json.write_text(json.dumps({"runs": results, "identical": same}, indent=1))
        return
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ and not torch.cuda.is_available():
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        )
    result = measure(args)
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
