"""Training cost of GRPO-MA trees: naive path log-probs vs the shared-prefix (packed) pass, and TRL's GRPO.

Three tables, measured side by side in one run, for T4A1, T4A4 and T16A1 (K thoughts x M answers):

1. Log-prob forward + backward only: one micro-batch of fixed-length random trees through
   ``path_log_probs`` (naive) and ``shared_prefix_log_probs`` (shared), best of ``--repeats``, with the peak
   resident memory growth: Linux VmHWM minus VmRSS after resetting VmHWM through /proc/self/clear_refs (not
   tracemalloc, which does not see torch's allocations). The script re-runs itself with
   ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors go back to the system; otherwise glibc keeps them
   and every measurement after the first reads close to 0.
2. The full trainer step of the real ``Trainer`` on synthetic shapes records (rollout / reward / update, the
   step metrics ``time/*_s``), ``train.logprob_pass`` naive vs shared alternating step by step, every thought
   and answer sampled to its budget (``SamplingParams.ignore_stop``); medians after warm-up steps.
3. ``--with-trl``: our M=1 step (T4A1, re-measured just before) next to TRL's ``GRPOTrainer`` on the same
   model, prompts, images, batch (prompts x 4 generations) and completion length (TRL's ``min_new_tokens`` =
   ``max_completion_length`` = our thought + ``</think>`` + answer), TRL in a separate process. TRL lives in
   ``.cache/bench-trl`` (see ``TRL_INSTALL``), never in .venv.

Presets: the tiny test model (16 image tokens) and the larger ``bench`` model with a 448x448 image (256 image
tokens). Full run (~7 minutes on 2 shared cores)::

    .venv/bin/python benchmarks/train_step.py --with-trl          # --quick: the tiny preset only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import torch
from PIL import Image

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import ModelConfig, load_config
from vlm_grpoma.datasets.images import load_image
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.models.base import PromptInputs, SpecialTokens
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.models.tiny import build_tiny_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
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
        records.append(
            Record(
                id=f"b{i}",
                image=str(path),
                task="detection",
                prompt="the blue square",
                width=side,
                height=side,
                ground_truth=Boxes((Box(10, 10, 50, 50),)),
            )
        )
    return adapter.build_inputs(records)


def fixed_tree(
    prompts: list[PromptInputs],
    tokens: SpecialTokens,
    k: int,
    m: int,
    thought_len: int,
    answer_len: int,
    seed: int = 0,
) -> RolloutTree:
    """A K x M tree of random plain-text tokens, every thought and answer at its full length."""
    g = torch.Generator().manual_seed(seed)
    b = len(prompts)
    text = torch.arange(3, 200)  # plain tokens of the tiny BPE vocabularies (no special or vision ids)
    thoughts = text[torch.randint(len(text), (b, k, thought_len), generator=g)]
    answers = text[torch.randint(len(text), (b, k, m, answer_len), generator=g)]
    return RolloutTree(
        prompts,
        tokens.pad_id,
        thoughts,
        torch.ones_like(thoughts, dtype=torch.bool),
        torch.zeros(thoughts.shape),
        [["stop"] * k] * b,
        [[""] * k] * b,
        answers,
        torch.ones_like(answers, dtype=torch.bool),
        torch.zeros(answers.shape),
        [[["stop"] * m] * k] * b,
        [[[""] * m] * k] * b,
    )


def _rss_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def measure(
    fn: LogProbFn, model: torch.nn.Module, tree: RolloutTree, tokens: SpecialTokens, repeats: int
) -> dict[str, float]:
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


def bench_preset(
    preset: str, folder: Path, args: argparse.Namespace, workdir: Path, methods: dict[str, LogProbFn]
) -> list[dict]:
    side = IMAGE_SIDE[preset]
    loaded = load_model(ModelConfig(name_or_path=str(folder), dtype="float32", max_pixels=side * side))
    model, tokens = loaded.model.train(), loaded.adapter.tokens
    prompts = make_prompts(loaded.adapter, workdir, args.prompts, side)
    image_tokens = int((prompts[0].input_ids == tokens.image_id).sum())
    rows = []
    for k, m in CONFIGS:
        tree = fixed_tree(prompts, tokens, k, m, args.thought_len, args.answer_len)
        row = {
            "preset": preset,
            "image_tokens": image_tokens,
            "prompt_tokens": len(prompts[0].input_ids),
            "config": f"T{k}A{m}",
        }
        for name, fn in methods.items():
            for key, value in measure(fn, model, tree, tokens, args.repeats).items():
                row[f"{name}_{key}"] = value
        rows.append(row)
        print(
            f"  {preset} T{k}A{m}: " + ", ".join(f"{n} {row[f'{n}_seconds']:.3f}s" for n in methods),
            flush=True,
        )
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
            print(
                f"  {preset:7} {n:8} T4A4/T4A1 = {t['T4A4'] / t['T4A1']:.2f}   T4A4/T16A1 = {t['T4A4'] / t['T16A1']:.2f}"
            )


# --- Shared-prefix mask at long packed rows: dense [L, L] (SDPA) vs FlexAttention BlockMask -----------------

MASK_LENGTHS = (1024, 4096, 8192, 16384)


def _tensor_bytes(value) -> int:
    """Bytes held by a tensor or by every tensor a BlockMask keeps."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
    names += ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")
    return sum(_tensor_bytes(getattr(value, n)) for n in names if getattr(value, n) is not None)


def mask_child(folder: Path, length: int, workdir: Path) -> dict[str, float]:
    """One packed row of ``length`` tokens (T4A4): each mask's build time, peak RSS growth and bytes held, and
    the SDPA pass (forward + backward) time and peak at that length."""
    from vlm_grpoma.trainer.packed import block_mask, dense_mask, pack

    loaded = load_model(ModelConfig(name_or_path=str(folder), dtype="float32", max_pixels=112 * 112))
    model, tokens = loaded.model.train(), loaded.adapter.tokens
    prompts = make_prompts(loaded.adapter, workdir, 1, 112)
    answer = 16
    thought = (length - len(prompts[0].input_ids) - 16 * answer) // 4
    tree = fixed_tree(prompts, tokens, 4, 4, thought, answer)
    packed = pack(model, tree, [0], tokens)
    row = {"length": packed.input_ids.shape[1]}
    cpu = torch.device("cpu")
    for name, build in (
        ("dense", lambda: dense_mask(packed, torch.float32, cpu)),
        ("flex", lambda: block_mask(packed, cpu)),
    ):
        Path("/proc/self/clear_refs").write_text("5")
        base, start = _rss_kib("VmRSS"), time.perf_counter()
        mask = build()
        row[f"{name}_mask_s"] = time.perf_counter() - start
        row[f"{name}_mask_peak_mib"] = (_rss_kib("VmHWM") - base) / 1024
        row[f"{name}_mask_held_mib"] = _tensor_bytes(mask) / 2**20
        del mask
    result = measure(shared_prefix_log_probs, model, tree, tokens, repeats=1)
    row["sdpa_pass_s"], row["sdpa_pass_peak_mib"] = result["seconds"], result["peak_mib"]
    return row


def bench_masks(args: argparse.Namespace) -> list[dict]:
    """The mask table at :data:`MASK_LENGTHS`, one child process per length (a fresh peak; a length that runs
    out of ``--mask-timeout`` seconds is reported as not run)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_model("qwen2_vl", Path(tmp) / "tiny", seed=0)
        for length in args.mask_lengths:
            out = Path(tmp) / f"{length}.json"
            command = [sys.executable, __file__, "--mask-child", str(folder), str(length), str(out)]
            try:
                subprocess.run(command, check=True, timeout=args.mask_timeout)
                rows.append(json.loads(out.read_text()))
            except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as err:
                rows.append({"length": length, "error": type(err).__name__})
            print(f"  mask table: {rows[-1]}", flush=True)
    print("\n== shared-prefix mask, one packed row (T4A4, tiny qwen2_vl, fp32) ==")
    print(
        f"{'L':>6} {'dense held':>11} {'dense peak':>11} {'dense s':>8} {'flex held':>10} {'flex peak':>10} {'flex s':>7} {'SDPA pass s':>12} {'SDPA peak':>10}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['length']:6d} not run ({r['error']})")
            continue
        print(
            f"{r['length']:6d} {r['dense_mask_held_mib']:9.1f}Mi {r['dense_mask_peak_mib']:9.1f}Mi "
            f"{r['dense_mask_s']:8.2f} {r['flex_mask_held_mib']:8.2f}Mi {r['flex_mask_peak_mib']:8.1f}Mi "
            f"{r['flex_mask_s']:7.2f} {r['sdpa_pass_s']:12.2f} {r['sdpa_pass_peak_mib']:8.1f}Mi"
        )
    return rows


# --- Full trainer step: rollout + rewards + update of the real GRPO-MA Trainer, naive vs shared pass --------

STEP_KEYS = (
    "time/rollout_s",
    "time/reward_s",
    "time/update_s",
    "time/step_s",
    "lengths/thought_mean",
    "lengths/answer_mean",
)
PASSES = ("naive", "shared")


class FixedLengthTrainer(GRPOMATrainer):
    """The real trainer, but every thought and answer is sampled to its full budget (``ignore_stop``), so the
    configurations and passes compared do known, equal-per-token work."""

    def _rollout(self, records: Sequence[Record], refill_round: int = 0) -> RolloutTree:
        prompts = self.adapter.build_inputs(records)
        params = replace(self._sampling_params(refill_round), ignore_stop=True)
        with self.engine.generation() as module:
            return HFRolloutEngine.for_adapter(module, self.adapter).sample(prompts, params)


def shapes_records(workdir: Path, side: int, n: int) -> Path:
    """``n`` synthetic shapes detection records with ``side`` x ``side`` images (the trainer's real data path)."""
    return generate_shapes(
        "detection", n, workdir / f"shapes-{side}", seed=0, config=replace(EASY, image_size=side)
    )


def trainer_config(
    model_dir: Path, data: Path, out: Path, side: int, k: int, m: int, args: argparse.Namespace
):
    """The tiny-model test setup (ZeRO 0, no KL, one micro-batch of all the step's prompts) at K x M."""
    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            "model.dtype=float32",
            f"model.max_pixels={side * side}",
            f"data.train_path={data}",
            f"logging.output_dir={out}",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
            "train.steps=1000",
            f"train.prompts_per_step={args.prompts}",
            f"train.micro_batch_prompts={args.prompts}",
            f"rollout.num_thoughts={k}",
            f"rollout.answers_per_thought={m}",
            f"rollout.max_thought_tokens={args.thought_len}",
            f"rollout.max_answer_tokens={args.answer_len}",
            "algorithm.kl_beta=0",
            "optim.learning_rate=1e-4",
            "deepspeed.zero_stage=0",
            "seed=0",
        ],
    )


def bench_steps(
    preset: str,
    model_dir: Path,
    data: Path,
    side: int,
    args: argparse.Namespace,
    workdir: Path,
    configs: Sequence[tuple[int, int]] = CONFIGS,
    steps: int | None = None,
) -> list[dict]:
    """Median step metrics per (config, pass). One Trainer per config; the passes alternate step by step (in
    alternating order), so both see the same rollouts' shapes and the same background load."""
    rows = []
    for k, m in configs:
        # fresh: nothing to resume
        out = Path(tempfile.mkdtemp(prefix=f"run-{preset}-T{k}A{m}-", dir=workdir))
        config = trainer_config(model_dir, data, out, side, k, m, args)
        trainer = FixedLengthTrainer(config)
        samples: dict[str, list[dict[str, float]]] = {p: [] for p in PASSES}
        for step in range(args.warmup + (steps or args.steps)):
            for name in PASSES if step % 2 == 0 else PASSES[::-1]:
                trainer.config = replace(config, train=replace(config.train, logprob_pass=name))
                metrics = trainer.train_step()
                trainer.step += 1
                if step >= args.warmup:
                    samples[name].append(metrics)
        trainer.engine.close()
        for name in PASSES:
            row = {"preset": preset, "config": f"T{k}A{m}", "pass": name, "steps": len(samples[name])}
            for key in STEP_KEYS:
                values = [s[key] for s in samples[name]]
                row[key] = statistics.median(values)
                if key.startswith("time/"):
                    row[key + ":spread"] = (max(values) - min(values)) / max(row[key], 1e-9)
            row["reward_mean"] = statistics.fmean(s["reward/total_mean"] for s in samples[name])
            rows.append(row)
        print(
            f"  {preset} T{k}A{m} step: "
            + ", ".join(f"{r['pass']} update {r['time/update_s']:.3f}s" for r in rows[-2:]),
            flush=True,
        )
    return rows


def print_step_table(rows: list[dict]) -> None:
    print(
        f"{'preset':7} {'config':7} {'pass':7} {'rollout s':>10} {'reward s':>9} {'update s':>9} {'step s':>8} "
        f"{'spread upd':>10} {'thought':>8} {'answer':>7} {'reward':>7}"
    )
    for r in rows:
        print(
            f"{r['preset']:7} {r['config']:7} {r['pass']:7} {r['time/rollout_s']:10.3f} {r['time/reward_s']:9.4f} "
            f"{r['time/update_s']:9.3f} {r['time/step_s']:8.3f} {r['time/update_s:spread']:10.0%} "
            f"{r['lengths/thought_mean']:8.1f} {r['lengths/answer_mean']:7.1f} {r['reward_mean']:7.3f}"
        )
    print("\nupdate-time ratios (median update s):")
    for preset in dict.fromkeys(r["preset"] for r in rows):
        by = {(r["config"], r["pass"]): r["time/update_s"] for r in rows if r["preset"] == preset}
        step = {(r["config"], r["pass"]): r["time/step_s"] for r in rows if r["preset"] == preset}
        for config in ("T4A1", "T4A4", "T16A1"):
            print(
                f"  {preset:7} {config:6} naive/shared update = {by[config, 'naive'] / by[config, 'shared']:.2f}"
                f"   naive/shared step = {step[config, 'naive'] / step[config, 'shared']:.2f}"
            )
        for name in PASSES:
            print(
                f"  {preset:7} {name:6} update T4A4/T4A1 = {by['T4A4', name] / by['T4A1', name]:.2f}"
                f"   T4A4/T16A1 = {by['T4A4', name] / by['T16A1', name]:.2f}"
                f"   | step T4A4/T4A1 = {step['T4A4', name] / step['T4A1', name]:.2f}"
                f"   T4A4/T16A1 = {step['T4A4', name] / step['T16A1', name]:.2f}"
            )


# --- Our M=1 GRPO step next to TRL's GRPOTrainer on the same tiny VLM, batch and completion length -----------

TRL_DIR = Path(__file__).resolve().parents[1] / ".cache" / "bench-trl"
TRL_INSTALL = (
    ".venv/bin/pip install --no-deps --target .cache/bench-trl trl==1.16.0 datasets==5.2.0 "
    "'pyarrow>=24' 'dill<0.4.2' 'multiprocess<0.70.20' pandas xxhash  (TRL and only the packages it "
    "needs that .venv lacks; never torch/transformers; on sys.path only in benchmarks/train_step.py's TRL "
    "part)"
)


def import_trl():
    """TRL from its isolated folder, or the reason it cannot be imported (then the TRL table is skipped)."""
    sys.path.insert(0, str(TRL_DIR))
    try:
        import datasets
        import trl
        from trl import GRPOConfig, GRPOTrainer
        from trl.data_utils import prepare_multimodal_messages
    except Exception as err:  # noqa: BLE001 - any import failure means: skip the table and say why
        return None, f"{type(err).__name__}: {err}"
    versions = {
        name: version(name)
        for name in ("trl", "datasets", "pyarrow", "pandas", "dill", "multiprocess", "xxhash")
    }
    (TRL_DIR / "README.txt").write_text(
        "Installed for benchmarks/train_step.py --with-trl only, isolated from .venv: "
        + TRL_INSTALL
        + "\nversions: "
        + ", ".join(f"{n} {v}" for n, v in versions.items())
        + "\n"
    )
    return (datasets, trl, GRPOConfig, GRPOTrainer, prepare_multimodal_messages), None


def trl_messages(adapter, record: Record) -> list[dict[str, str]]:
    """Our adapter's chat for ``record`` as plain-text messages; TRL inserts the record's image itself."""
    return [
        {"role": msg["role"], "content": "".join(p["text"] for p in msg["content"] if p["type"] == "text")}
        for msg in adapter.messages(record, [Image.new("RGB", (8, 8))])
    ]


def trl_dataset(datasets, prompts: list[list[dict[str, str]]], images: list[Image.Image]):
    """``Dataset.from_dict`` with a fixed fingerprint: hashing the Arrow table for one fails here (datasets 5.2's
    dill pickler cannot pickle pyarrow's ``MonthDayNano`` class, with pyarrow 24 and 26 alike)."""
    features = datasets.Features(
        {
            "prompt": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
            "image": datasets.Image(),
        }
    )
    table = datasets.table.InMemoryTable.from_pydict(
        features.encode_batch({"prompt": prompts, "image": images}), schema=features.arrow_schema
    )
    return datasets.Dataset(
        table, info=datasets.DatasetInfo(features=features), fingerprint="train-step-bench"
    )


def bench_trl(
    model_dir: Path,
    data: Path,
    side: int,
    k: int,
    completion_len: int,
    args: argparse.Namespace,
    workdir: Path,
) -> dict | str:
    """Per-step wall time of TRL's GRPOTrainer (generation + reward inside ``_generate_and_score_completions``,
    the rest is the policy update) with ``args.prompts`` prompts x ``k`` generations of exactly
    ``completion_len`` tokens (``min_new_tokens``); or why it could not run."""
    trl_parts, why = import_trl()
    if trl_parts is None:
        return f"cannot import TRL from {TRL_DIR}: {why}"
    datasets, trl, GRPOConfig, GRPOTrainer, prepare_multimodal_messages = trl_parts
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback

    adapter = load_model(ModelConfig(name_or_path=str(model_dir), dtype="float32")).adapter
    records = read_records(data)[: args.prompts]
    dataset = trl_dataset(
        datasets, [trl_messages(adapter, r) for r in records], [load_image(r) for r in records]
    )
    config = GRPOConfig(
        output_dir=str(workdir / "trl"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=0,
        report_to=[],
        per_device_train_batch_size=args.prompts * k,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=k,
        max_completion_length=completion_len,
        generation_kwargs={"min_new_tokens": completion_len},
        temperature=1.0,
        beta=0.0,
        loss_type="grpo",
        use_vllm=False,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=False,
    )
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(model_dir, max_pixels=side * side)  # our adapter's bound

    def zero_reward(completions, **_) -> list[float]:  # what a random model earns from ours too: no signal
        return [0.0] * len(completions)

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.steps, self.logs = [], []

        def on_step_begin(self, *_, **__) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__) -> None:
            self.steps.append(time.perf_counter() - self.start)

        def on_log(self, _args, _state, _control, logs=None, **__) -> None:
            self.logs.append(dict(logs or {}))

    clock = StepClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=zero_reward,
        args=config,
        train_dataset=dataset,
        processing_class=processor,
        callbacks=[clock],
    )
    generation: list[float] = []
    generate = trainer._generate_and_score_completions

    def timed_generate(*a, **kw):
        start = time.perf_counter()
        out = generate(*a, **kw)
        generation.append(time.perf_counter() - start)
        return out

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    keep = slice(args.warmup, None)
    steps, gens = clock.steps[keep], generation[keep]
    lengths = [log["completions/mean_length"] for log in clock.logs if "completions/mean_length" in log][keep]
    first = prepare_multimodal_messages(dataset[0]["prompt"], images=[dataset[0]["image"]])
    prompt_ids = processor.apply_chat_template(
        first, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"][0]
    return {
        "trl_version": trl.__version__,
        "threads": torch.get_num_threads(),
        "steps": len(steps),
        "step_s": statistics.median(steps),
        "step_spread": (max(steps) - min(steps)) / statistics.median(steps),
        "generate_s": statistics.median(gens),
        "update_s": statistics.median(s - g for s, g in zip(steps, gens)),
        "completion_len": statistics.fmean(lengths),
        "prompt_tokens": len(prompt_ids),
    }


DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_trl_child(
    model_dir: Path,
    data: Path,
    side: int,
    k: int,
    completion_len: int,
    args: argparse.Namespace,
    workdir: Path,
) -> dict | str:
    """Run :func:`bench_trl` in a fresh process: in this one our trainer has set up a 1-rank process group, under
    which accelerate would wrap TRL's model in DDP and raise the thread count to the core count."""
    out = workdir / "trl.json"
    env = {key: value for key, value in os.environ.items() if key not in DIST_ENV}
    env["OMP_NUM_THREADS"] = str(args.threads)
    command = [
        sys.executable,
        __file__,
        "--trl-child",
        str(model_dir),
        str(data),
        str(side),
        str(k),
        str(completion_len),
        "--prompts",
        str(args.prompts),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.trl_steps),
        "--threads",
        str(args.threads),
        "--json",
        str(out),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return f"the TRL process failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(out.read_text())


def print_trl_table(
    ours: list[dict], trl_row: dict | str, k: int, prompts: int, our_prompt_tokens: int
) -> None:
    if isinstance(trl_row, str):
        print(f"TRL comparison skipped: {trl_row}")
        return
    print(
        f"{prompts} prompts x {k} generations (M=1), one micro-batch, fp32 CPU, beta=0, TRL in its own process "
        f"with {trl_row['threads']} thread(s) right after ours; medians of {trl_row['steps']} steps each"
    )
    print(
        f"{'who':22} {'prompt':>6} {'completion':>10} {'gen+reward s':>12} {'update s':>9} {'step s':>8} "
        f"{'spread':>7} {'TRL/ours step':>13}"
    )
    print(
        f"{'TRL ' + trl_row['trl_version'] + ' GRPOTrainer':22} {trl_row['prompt_tokens']:6d} "
        f"{trl_row['completion_len']:10.1f} {trl_row['generate_s']:12.3f} {trl_row['update_s']:9.3f} "
        f"{trl_row['step_s']:8.3f} {trl_row['step_spread']:7.0%} {1.0:13.2f}"
    )
    for r in ours:
        length = r["lengths/thought_mean"] + r["lengths/answer_mean"]
        print(
            f"{'ours ' + r['pass'] + ' pass':22} {our_prompt_tokens:6d} {length:10.1f} "
            f"{r['time/rollout_s'] + r['time/reward_s']:12.3f} {r['time/update_s']:9.3f} {r['time/step_s']:8.3f} "
            f"{r['time/step_s:spread']:7.0%} {trl_row['step_s'] / r['time/step_s']:13.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "bench"], choices=sorted(IMAGE_SIDE))
    parser.add_argument("--quick", action="store_true", help="only the tiny preset")
    parser.add_argument("--arch", default="qwen2_5_vl", choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
    parser.add_argument(
        "--prompts", type=int, default=2, help="prompts per micro-batch (and per trainer step)"
    )
    parser.add_argument("--thought-len", type=int, default=64)
    parser.add_argument("--answer-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2, help="log-prob passes timed (best of)")
    parser.add_argument("--warmup", type=int, default=1, help="trainer steps not timed, per pass")
    parser.add_argument("--steps", type=int, default=3, help="trainer steps timed (median), per pass")
    parser.add_argument(
        "--with-trl",
        action="store_true",
        help=f"also time TRL's GRPOTrainer on the tiny preset (TRL installed under {TRL_DIR})",
    )
    parser.add_argument(
        "--trl-steps",
        type=int,
        default=5,
        help="steps timed (median) of TRL and of our T4A1 step measured just before it",
    )
    parser.add_argument(
        "--trl-child", nargs=5, metavar=("MODEL", "DATA", "SIDE", "K", "LENGTH"), help=argparse.SUPPRESS
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--mask-table",
        action="store_true",
        help="only the dense vs FlexAttention mask table at 1k-16k tokens",
    )
    parser.add_argument("--mask-lengths", type=int, nargs="+", default=list(MASK_LENGTHS))
    parser.add_argument("--mask-timeout", type=float, default=300.0, help="seconds per length")
    parser.add_argument("--mask-child", nargs=3, metavar=("MODEL", "LENGTH", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mask_child:
        torch.set_num_threads(args.threads)
        folder, length, out = args.mask_child
        with tempfile.TemporaryDirectory() as tmp:
            Path(out).write_text(json.dumps(mask_child(Path(folder), int(length), Path(tmp))))
        return
    if args.trl_child:
        torch.set_num_threads(args.threads)
        model_dir, data, side, k, length = args.trl_child
        with tempfile.TemporaryDirectory() as tmp:
            result = bench_trl(Path(model_dir), Path(data), int(side), int(k), int(length), args, Path(tmp))
        args.json.write_text(json.dumps(result))
        return
    if args.quick:
        args.presets = ["tiny"]
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # see the module docstring
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        )
    if args.mask_table:
        rows = bench_masks(args)
        if args.json:
            args.json.write_text(json.dumps({"masks": rows}, indent=1))
        return
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(TRL_DIR.parent / "torch_extensions"))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.arch == "qwen3_vl":
        IMAGE_SIDE.update({p: s * 16 // 14 for p, s in IMAGE_SIDE.items()})  # patch 16: same token counts
    rows, step_rows, trl_runs = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for preset in args.presets:
            folder = build_tiny_model(args.arch, workdir / f"{args.arch}-{preset}", seed=0, preset=preset)
            rows += bench_preset(preset, folder, args, workdir, METHODS)
            side = IMAGE_SIDE[preset]
            data = shapes_records(workdir, side, max(args.prompts, 4))
            step_rows += bench_steps(preset, folder, data, side, args, workdir)
            if args.with_trl:  # our T4A1 step again, right before TRL's, so both run under the same load
                ours = bench_steps(
                    preset, folder, data, side, args, workdir, configs=((4, 1),), steps=args.trl_steps
                )
                length = round(ours[0]["lengths/thought_mean"] + ours[0]["lengths/answer_mean"])
                prompt_tokens = next(r["prompt_tokens"] for r in rows if r["preset"] == preset)
                trl_runs.append(
                    (preset, ours, run_trl_child(folder, data, side, 4, length, args, workdir), prompt_tokens)
                )
    print(
        f"\narch {args.arch}, {args.prompts} prompts per micro-batch, thought {args.thought_len} / answer "
        f"{args.answer_len} tokens, {args.threads} thread(s) ({torch.get_num_threads()} at the end), best of "
        f"{args.repeats}; MiB = peak RSS growth"
    )
    print("\n== log-prob forward + backward only ==")
    print_table(rows, list(METHODS))
    print(
        f"\n== full GRPO-MA trainer step (real Trainer, {args.prompts} prompts/step, budgets thought "
        f"{args.thought_len} (+</think>) / answer {args.answer_len}, stops ignored; medians of {args.steps} steps "
        f"after {args.warmup} warm-up, passes interleaved; spread = (max-min)/median of update s) =="
    )
    print("random models earn ~zero reward -> zero advantages: the update still does all its work")
    print_step_table(step_rows)
    for preset, ours, trl_row, prompt_tokens in trl_runs:
        print(f"\n== our M=1 GRPO step vs TRL's GRPOTrainer ({preset} preset, T4A1 = 4 generations) ==")
        print_trl_table(ours, trl_row, 4, args.prompts, prompt_tokens)
    if args.json:
        args.json.write_text(json.dumps({"logprobs": rows, "steps": step_rows, "trl": trl_runs}, indent=1))


if __name__ == "__main__":
    main()
