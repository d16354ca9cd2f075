"""Typed run configuration: dataclasses, YAML loading, dotted ``key=value`` overrides, validation.

Everything here is cheap to import (no torch), so a bad config fails in well under a second, before any
model, dataset or process group is touched. Every error is one line that names the offending key.

Each leaf field carries a ``#:`` doc line above it (what it does, unit and range, the TRL ``GRPOConfig`` /
verl name where one exists) and, where a value can be out of range on its own, a rule in its metadata
(:class:`Range`, :class:`NonEmpty`) that one checker applies to every field. :func:`validate` keeps the rules
that relate several fields. :func:`config_reference` lists every leaf key with its type, default, range and
doc, for ``train --help`` and the config reference page.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import functools
import importlib.util
import inspect
import math
import reprlib
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, Union

import yaml

from vlm_grpoma.errors import ConfigError, MissingDependencyError

__all__ = [
    "Config",
    "ConfigError",
    "FieldDoc",
    "check_optional_dependencies",
    "config_from_dict",
    "config_reference",
    "load_config",
    "validate",
]

# ---------------------------------------------------------------------------------------------------------
# Single-field rules, declared in each field's metadata and applied by `check_fields`.

_RULE = "rule"
_T = TypeVar("_T")


class Rule(Protocol):
    """What one field's values must satisfy, on their own."""

    def allows(self, value: Any) -> bool: ...

    def complaint(self, value: Any) -> str: ...

    def describe(self) -> str: ...


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``ge``/``gt`` below, ``le``/``lt`` above (its meaning), ``cap`` a sanity ceiling
    beyond which a value can only be a slip (learning rate 1e300); errors name the bound that was crossed."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    cap: float | None = None
    what: str = ""  # before the condition: "a finite number of seconds >= 0"
    unit: str = ""  # after it: "> 0 seconds"
    note: str = ""  # in brackets after it: "(0: no limit)"

    def allows(self, value: Any) -> bool:
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
            and (self.cap is None or value <= self.cap)
        )

    def _condition(self) -> str:
        low = (
            f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else ""
        )
        high = (
            f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else ""
        )
        if low and high:
            return f"in {low}, {high}"
        if low:
            return (">= " if low[0] == "[" else "> ") + low[1:]
        return ("<= " if high[-1] == "]" else "< ") + high[:-1] if high else "any number"

    def _dress(self, condition: str) -> str:
        text = " ".join(part for part in (self.what, condition, self.unit) if part)
        return f"{text} ({self.note})" if self.note else text

    def complaint(self, value: Any) -> str:
        if self.cap is not None and value > self.cap:
            return f"must be at most {_num(self.cap)}{' ' + self.unit if self.unit else ''}, got {value}"
        return f"must be {self._dress(self._condition())}, got {value}"

    def describe(self) -> str:
        cap = f", at most {_num(self.cap)}" if self.cap is not None else ""
        return self._dress(self._condition()) + cap


@dataclass(frozen=True)
class NonEmpty:
    """A string with more than whitespace, or a mapping with an entry; ``message`` says what is missing."""

    message: str

    def allows(self, value: Any) -> bool:
        return bool(value.strip() if isinstance(value, str) else value)

    def complaint(self, value: Any) -> str:
        return self.message

    def describe(self) -> str:
        return "non-empty"


def checked(default: _T, rule: Rule) -> _T:
    """A dataclass field with its default and the single-field rule ``check_fields`` applies to it."""
    return typing.cast(_T, field(default=default, metadata={_RULE: rule}))


# ---------------------------------------------------------------------------------------------------------
# The sections. A `#:` line above each field documents it (tested: tests/test_config.py).


@dataclass
class LoraConfig:
    """LoRA adapters on the language model (PEFT); the vision tower follows ``model.freeze_vision``."""

    #: train LoRA adapters instead of the full language model (TRL: peft_config; verl: model.lora_rank > 0)
    enabled: bool = False
    #: adapter rank, >= 1 (TRL/PEFT: r; verl: model.lora_rank)
    r: int = checked(16, Range(ge=1, cap=4096))
    #: adapter scale numerator: updates are scaled by alpha / r, > 0
    #: (PEFT: lora_alpha; verl: model.lora_alpha)
    alpha: int = checked(32, Range(gt=0, cap=65536))
    #: dropout on the adapter input, a probability in [0, 1) (PEFT: lora_dropout)
    dropout: float = checked(0.05, Range(ge=0, lt=1))
    #: names of the language-model linear layers that get adapters
    #: (PEFT: target_modules; verl: model.target_modules)
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@dataclass
class ModelConfig:
    """Which checkpoint to train and how to load it."""

    #: the Qwen-VL checkpoint: a Hugging Face hub id, a model folder or a run's checkpoints/step-N/model
    #: (TRL: the trainer's model / model_name_or_path; verl: actor_rollout_ref.model.path)
    name_or_path: str = ""
    #: dtype of the loaded weights; auto: the checkpoint's own; must agree with deepspeed.precision
    #: (TRL: model_init_kwargs.dtype)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    #: attention kernel; train.logprob_pass=shared needs sdpa, eager or flex_attention
    #: (TRL: model_init_kwargs.attn_implementation)
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flex_attention"] = "sdpa"
    #: run the checkpoint's own Python code (transformers' trust_remote_code); off unless you trust it
    trust_remote_code: bool = False
    #: smallest image area in pixels the processor resizes to, >= 1 and <= model.max_pixels
    #: (Qwen-VL processor: min_pixels)
    min_pixels: int = checked(56 * 56, Range(ge=1))
    #: largest image area in pixels the processor resizes to; sets the image tokens per prompt
    #: (about pixels / 28^2; Qwen-VL processor: max_pixels)
    max_pixels: int = checked(448 * 448, Range(ge=1))
    #: "full": system instruction + detailed answer format (real checkpoints); "compact": a one-line
    #: instruction, ~3x shorter prompts for tiny models that learn the format from SFT (the CPU demo).
    prompt_style: Literal["full", "compact"] = "full"
    #: Who opens the thought: "auto" follows the chat template (Qwen3-VL Thinking releases end the generation
    #: prompt with "<think>\n", so the model starts inside the thought); "opened" makes the prompt open it,
    #: "closed" leaves "<think>" to the model, whatever the template does.
    thinking: Literal["auto", "opened", "closed"] = "auto"
    #: keep the vision tower's weights fixed (trained, or LoRA-saved in full, when false)
    freeze_vision: bool = True
    #: recompute activations in the backward pass: less activation memory, one more forward per micro-batch
    #: (TRL: gradient_checkpointing; verl: model.enable_gradient_checkpointing)
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class DataConfig:
    """Records files (JSONL, see `check-data`) for training, held-out scoring in training, and `eval`.

    Two held-out keys for two readers, kept apart: ``eval_sets`` names files scored *during* training with
    the training rewards (every ``train.eval_every`` steps, one metric per name, any task's records);
    ``eval_path`` is the one file the ``eval`` command scores after training with grounding metrics (IoU,
    AP), choosing splits inside it with ``--split``. Merging them would make one key mean a file of splits
    in one command and named files in another; both shapes are used by shipped configs and commands.
    """

    #: records file (JSONL) to train on; only its data.task records of split data.train_split are used
    #: (TRL: train_dataset; verl: data.train_files)
    train_path: str = ""
    #: records file read by the eval command (`vlm-grpoma eval`): every split but data.train_split, or those
    #: named by --split; not read during training (that is data.eval_sets) (verl: data.val_files)
    eval_path: str = ""
    #: held-out sets scored during GRPO-MA training every ``train.eval_every`` steps, name -> records.jsonl
    #: (records of ``data.task``, any split), e.g. {seen: data/seen.jsonl, unseen: data/unseen.jsonl}
    #: (TRL: the trainer's eval_dataset given as a dict; verl: data.val_files)
    eval_sets: dict[str, str] = field(default_factory=dict)
    #: training uses only the records of this task and split (converters may write several splits to one file)
    task: Literal["detection", "affordance", "trajectory", "manipulation"] = "detection"
    #: the split of data.train_path to train on (records carry a split name)
    train_split: str = "train"
    #: a record whose whole prompt (chat template, instruction and image tokens) is longer is refused when the
    #: records are loaded (or skipped with skip_bad_records); tokens, >= 0, 0: no limit
    #: (TRL: max_prompt_length, verl: data.max_prompt_length, but prompts are never cut here)
    max_prompt_tokens: int = checked(4096, Range(ge=0, note="0: no limit"))
    #: leave out (with one warning line) the records that fail validation, their images included; else the
    #: first one is an error
    skip_bad_records: bool = False
    #: reshuffle the training records every epoch (seeded by `seed`)
    #: (TRL: shuffle_dataset; verl: data.shuffle)
    shuffle: bool = True


@dataclass
class VLLMConfig:
    """The colocated vLLM engine of `rollout.backend=vllm` (a CUDA or a CPU build of vLLM)."""

    #: share of each GPU's memory vLLM may take (weights, KV cache), in (0, 1]; on the CPU build the share
    #: of the machine's RAM (TRL: vllm_gpu_memory_utilization; verl: rollout.gpu_memory_utilization)
    gpu_memory_utilization: float = checked(0.3, Range(gt=0, le=1))
    #: GPUs one vLLM engine spans, >= 1, dividing the world size
    #: (TRL: vllm_tensor_parallel_size; verl: rollout.tensor_model_parallel_size)
    tensor_parallel_size: int = checked(1, Range(ge=1, cap=1024))
    #: release vLLM's weights and KV cache during the update (not supported by the CPU build)
    #: (TRL: vllm_enable_sleep_mode)
    enable_sleep_mode: bool = False
    #: context length of the engine in tokens, >= 0; 0: the model's own limit
    #: (TRL: vllm_max_model_length; verl: rollout.max_model_len)
    max_model_len: int = checked(0, Range(ge=0, note="0: the model's own limit"))
    #: run vLLM without CUDA graphs: slower, less memory, faster start (verl: rollout.enforce_eager)
    enforce_eager: bool = False
    #: KV/prefix-cache block in tokens, >= 0; 0: 32 on CPU, vLLM's default on CUDA
    block_size: int = checked(0, Range(ge=0, cap=65536, note="0: the build's default"))
    #: KV cache size in GiB, >= 0; 0: from gpu_memory_utilization (vLLM: kv_cache_memory_bytes)
    kv_cache_gib: float = checked(0.0, Range(ge=0, cap=1e6, note="0: from gpu_memory_utilization"))


@dataclass
class RolloutConfig:
    """Two-phase sampling: K thoughts per prompt, then M answers continuing each thought.

    The sampling ranges below are checked in :func:`validate` by the rollout's own sampling rules.
    """

    #: sampler: hf (a transformers sampling loop, any machine) or vllm (a colocated vLLM engine, needs vLLM)
    #: (TRL: use_vllm; verl: rollout.name)
    backend: Literal["hf", "vllm"] = "hf"
    #: K, thoughts sampled per prompt, >= 2 (their advantages compare them); K x M <= 4096
    #: (TRL: num_generations with M = 1; verl: rollout.n)
    num_thoughts: int = 4
    #: M, answers sampled after each thought, >= 1; M = 1 is GRPO
    answers_per_thought: int = 4
    #: sampling temperature of thoughts and answers: 0 (greedy) or >= 0.01
    #: (TRL: temperature; verl: rollout.temperature)
    temperature: float = 1.0
    #: nucleus sampling mass in (0, 1]; 1: off (TRL: top_p; verl: rollout.top_p)
    top_p: float = 1.0
    #: sample among the k most likely tokens, >= 0; 0: off (TRL: top_k; verl: rollout.top_k)
    top_k: int = 0
    #: token budget of a thought, >= 1 (with max_answer_tokens: TRL max_completion_length,
    #: verl data.max_response_length)
    max_thought_tokens: int = 256
    #: token budget of an answer, >= 1
    max_answer_tokens: int = 64
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class RolloutCorrectionConfig:
    """Importance weights for the rollout/trainer log-prob mismatch (``vlm_grpoma/algorithm/rollout_correction.py``)."""

    #: "tis": min(π_old/π_rollout, cap) per token (TRL vllm_importance_sampling_correction, token_truncate);
    #: "mis": drop tokens (or segments) whose ratio leaves [1/cap, cap] (TRL *_mask modes); "none";
    #: "auto": tis with the vllm backend, none with hf (its log-probs are the trainer's to float precision)
    mode: Literal["auto", "none", "tis", "mis"] = "auto"
    #: "token": each token's ratio; "sequence": one ratio per thought or answer segment, exp(Σ log ratio)
    level: Literal["token", "sequence"] = "token"
    #: the truncation / masking bound on the ratio, > 1 (TRL vllm_importance_sampling_cap)
    cap: float = checked(2.0, Range(gt=1, cap=1e6))

    def resolved_mode(self, backend: str) -> str:
        """``mode`` with ``auto`` decided for the rollout backend."""
        if self.mode != "auto":
            return self.mode
        return "none" if backend == "hf" else "tis"


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling: drop prompts whose K·M rewards are all equal (no signal) and roll out more."""

    #: on: refill each rank's share of the step with informative prompts (EasyR1/verl filter_groups)
    enabled: bool = False
    #: extra rollouts of fresh prompts per step at most, >= 1; after them the step trains on what it has
    #: (verl: algorithm.filter_groups.max_num_gen_batches)
    max_rounds: int = checked(3, Range(ge=1, cap=1000))


@dataclass
class AlgorithmConfig:
    """GRPO-MA advantages and the clipped policy objective (see ``vlm_grpoma/algorithm``)."""

    #: std: advantages divided by the group's std + advantage_eps (GRPO); none: only centred (Dr. GRPO)
    #: (TRL: scale_rewards group / none; verl: algorithm.norm_adv_by_std_in_grpo)
    advantage_scale: Literal["std", "none"] = "std"
    #: added to the std before dividing, >= 0 (TRL adds 1e-4 too)
    advantage_eps: float = checked(1e-4, Range(ge=0, cap=1e6))
    #: lower clip of the importance ratio, 1 - clip_eps_low, in [0, 1)
    #: (TRL: epsilon; verl: actor.clip_ratio_low)
    clip_eps_low: float = checked(0.2, Range(ge=0, lt=1))
    #: upper clip of the importance ratio, 1 + clip_eps_high, >= 0 (DAPO: 0.28)
    #: (TRL: epsilon_high; verl: actor.clip_ratio_high)
    clip_eps_high: float = checked(0.2, Range(ge=0, cap=1e6))
    #: weight of the KL penalty to the reference model, >= 0; 0 builds no reference model
    #: (TRL: beta; verl: actor.kl_loss_coef with actor.use_kl_loss)
    kl_beta: float = checked(0.04, Range(ge=0, cap=1e6))
    #: how token losses become the loss: seq_mean_token_mean (GRPO), token_mean (DAPO),
    #: seq_mean_token_sum_norm (Dr. GRPO) (TRL: loss_type grpo / dapo / dr_grpo; verl: actor.loss_agg_mode)
    loss_aggregation: Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"] = (
        "seq_mean_token_mean"
    )
    #: λ, the weight of the thought tokens' loss against the answers', >= 0 (GRPO-MA; not in TRL/verl)
    thought_loss_weight: float = checked(1.0, Range(ge=0, cap=1e6))
    #: passes over each step's rollouts (μ), >= 1 (TRL: num_iterations; verl: actor.ppo_epochs)
    policy_epochs: int = checked(1, Range(ge=1, cap=1000))
    #: "k3": the per-token k3 estimator of KL(policy || reference) (TRL with use_bias_correction_kl=False);
    #: "k3_ratio": k3 times the importance ratio, differentiable (TRL's use_bias_correction_kl=True)
    kl_estimator: Literal["k3", "k3_ratio"] = "k3"
    #: the logits the ratio, the reference KL and the rollout's recorded log-probs are taken from: "sampling"
    #: divides them by rollout.temperature (TRL, verl); "raw" keeps them unscaled (this project before 2026-12)
    logprob_temperature: Literal["sampling", "raw"] = "sampling"
    #: the PPO ratio per token, or per thought/answer segment as GSPO defines it (TRL importance_sampling_level)
    importance_sampling_level: Literal["token", "sequence"] = "token"
    #: a thought's tokens counted once (GRPO-MA), M times (a naive K·M-sequence implementation) or √M times
    #: (TreeRL's 1/√n weighting of a shared segment) — for matching another implementation's results
    thought_weighting: Literal["once", "per_answer", "sqrt_answers"] = "once"
    #: entropy bonus c >= 0: loss - c·H per trained token, with the tokens' loss weights (verl entropy_coeff)
    entropy_coef: float = checked(0.0, Range(ge=0, cap=1e6))
    #: train only this top fraction of each micro-batch's tokens by entropy, in (0, 1]; 1: every token
    #: ("forking tokens"; TRL top_entropy_quantile)
    top_entropy_fraction: float = checked(1.0, Range(gt=0, le=1))
    #: importance weights for the rollout/trainer log-prob mismatch
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    #: drop constant-reward prompts and refill the step (DAPO)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)


@dataclass
class RewardConfig:
    """Reward functions by registered name, each with its weight in the total reward."""

    #: reward name (built-in, or file.py:function) -> its finite weight in the total reward; at least one
    #: (TRL: reward_funcs + reward_weights; verl: custom_reward_function)
    weights: dict[str, float] = field(
        default_factory=lambda: {"iou": 1.0, "format": 0.5},
        metadata={_RULE: NonEmpty("needs at least one reward function")},
    )
    #: constructor options per reward, e.g. {iou: {mode: giou}, manipulation: {workers: 2, timeout_s: 5}}
    options: dict[str, dict[str, bool | int | float | str]] = field(default_factory=dict)


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    #: AdamW step size, in (0, 1] (TRL: learning_rate; verl: actor.optim.lr)
    learning_rate: float = checked(1e-6, Range(gt=0, cap=1))
    #: AdamW decoupled weight decay, >= 0 (TRL: weight_decay; verl: actor.optim.weight_decay)
    weight_decay: float = checked(0.0, Range(ge=0, cap=1e3))
    #: AdamW first-moment decay, in [0, 1) (TRL: adam_beta1)
    adam_beta1: float = checked(0.9, Range(ge=0, lt=1))
    #: AdamW second-moment decay, in [0, 1) (TRL: adam_beta2)
    adam_beta2: float = checked(0.999, Range(ge=0, lt=1))
    #: learning rate after warm-up: constant, linear or cosine decay to 0 at train.steps
    #: (TRL: lr_scheduler_type)
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    #: optimizer steps of linear warm-up from 0, >= 0 (TRL: warmup_steps; verl: actor.optim.lr_warmup_steps)
    warmup_steps: int = checked(0, Range(ge=0))
    #: clip the gradient's global L2 norm to this, >= 0; 0: no clipping
    #: (TRL: max_grad_norm; verl: actor.grad_clip)
    max_grad_norm: float = checked(1.0, Range(ge=0, cap=1e12, note="0 disables clipping"))


@dataclass
class TrainConfig:
    """Batch arithmetic: prompts per optimizer step (global), split across ranks and micro-batches."""

    #: optimizer steps to train, >= 1 (TRL: max_steps; verl: trainer.total_training_steps)
    steps: int = checked(100, Range(ge=1))
    #: prompts per optimizer step over all ranks, >= 1, divisible by the world size
    #: (TRL: per_device_train_batch_size x gradient_accumulation_steps x GPUs / num_generations;
    #: verl: data.train_batch_size)
    prompts_per_step: int = checked(8, Range(ge=1))
    #: prompts per training micro-batch on one rank, >= 1, dividing each rank's prompts
    #: (TRL: per_device_train_batch_size / num_generations;
    #: verl: actor.ppo_micro_batch_size_per_gpu, which counts responses, not prompts)
    micro_batch_prompts: int = checked(1, Range(ge=1))
    #: token budget of one micro-batch (0: off, micro-batches of micro_batch_prompts prompts): prompts are grouped
    #: so that rows x longest row (shared pass: one packed row per prompt; naive: K*M path rows) stays within it;
    #: a prompt over the budget alone gets its own micro-batch. verl: ppo_max_token_len_per_gpu
    micro_batch_tokens: int = checked(0, Range(ge=0))
    #: "shared": image + prompt once per prompt and each thought once for its M answers (one packed row per
    #: prompt; needs sdpa/eager attention (4-D mask) or flex_attention (block mask)); "naive": one row per path.
    logprob_pass: Literal["shared", "naive"] = "shared"
    #: score greedy answers on ``data.eval_sets`` with the training rewards before step 1, every this many
    #: steps and after the last step; steps, >= 0, 0: never (TRL: eval_steps; verl: trainer.test_freq)
    eval_every: int = checked(0, Range(ge=0, note="0 disables evaluation"))
    #: prompts per greedy batch in that evaluation, >= 1 (TRL: per_device_eval_batch_size)
    eval_batch_prompts: int = checked(16, Range(ge=1))
    #: stop once the training steps (rollout, rewards, update; not evaluation or checkpoints) have taken this
    #: many seconds in all (0: no budget; ``train.steps`` stays the upper bound). Compares arms at equal time.
    time_budget_s: float = checked(0.0, Range(ge=0, what="a finite number of seconds", note="0: no budget"))
    #: seconds a rank waits in a collective (or at start-up for the others) before the job ends naming it;
    #: > 0, at most 7 days (604800)
    dist_timeout_s: float = checked(600.0, Range(gt=0, cap=7 * 86400, unit="seconds"))


@dataclass
class DeepSpeedConfig:
    """The DeepSpeed engine: ZeRO stage, precision, optimizer offload, process-group backend."""

    #: ZeRO stage 0 (plain data parallel), 1, 2 (optimizer + gradients sharded) or 3 (weights too)
    #: (TRL/verl: the DeepSpeed JSON's zero_optimization.stage; verl's FSDP is its counterpart)
    zero_stage: Literal[0, 1, 2, 3] = 2
    #: a DeepSpeed JSON to start from instead of the shipped zero{stage}.json; batch, precision and
    #: clipping are still set from this config (TRL: deepspeed)
    config_file: str = ""
    #: training precision: auto follows model.dtype, else bf16 on a GPU that has it, else fp32; bf16 and
    #: fp16 need a GPU (TRL: bf16 / fp16)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    #: keep the optimizer state in CPU memory (ZeRO-Offload; needs zero_stage >= 1)
    offload_optimizer: bool = False
    #: process-group backend: auto (nccl on GPUs, gloo on CPU), nccl or gloo
    dist_backend: Literal["auto", "nccl", "gloo"] = "auto"


@dataclass
class LoggingConfig:
    """Where a run writes its metrics, and to which trackers."""

    #: the run folder: config.yaml, metrics.jsonl, tensorboard/, samples.jsonl, checkpoints/
    #: (TRL: output_dir; verl: trainer.default_local_dir)
    output_dir: str = checked(
        "runs/default",
        NonEmpty("is empty: name the folder that receives metrics and checkpoints, e.g. runs/my-run"),
    )
    #: write metrics every this many steps, >= 1 (TRL: logging_steps)
    log_every: int = checked(1, Range(ge=1))
    #: also write TensorBoard event files under output_dir/tensorboard (TRL: report_to tensorboard)
    tensorboard: bool = True
    #: Weights & Biases project to log to (needs wandb installed); empty: no W&B
    #: (TRL: report_to wandb + WANDB_PROJECT; verl: trainer.logger wandb + trainer.project_name)
    wandb_project: str = ""
    #: show a progress bar on rank 0
    progress_bar: bool = True
    #: every this many GRPO-MA steps, write ``samples`` of rank 0's completions (texts and rewards) to
    #: samples.jsonl and TensorBoard text; steps, >= 0, 0: never (TRL: log_completions)
    samples_every: int = checked(10, Range(ge=0, note="0 logs no samples"))
    #: how many completions each such write holds, >= 1 (TRL: num_completions_to_print)
    samples: int = checked(4, Range(ge=1))


@dataclass
class CheckpointConfig:
    """Checkpoints under output_dir/checkpoints/step-N, and resuming from them."""

    #: save every this many steps, >= 0; 0: only at the end (TRL: save_steps; verl: trainer.save_freq)
    save_every: int = checked(0, Range(ge=0, note="0 saves only at the end"))
    #: checkpoints kept (the newest), >= 1 (TRL: save_total_limit; verl: trainer.max_actor_ckpt_to_keep)
    keep_last: int = checked(2, Range(ge=1))
    #: none: start fresh; auto: the newest complete checkpoint of output_dir, if any; or a step-N folder
    #: (TRL: resume_from_checkpoint; verl: trainer.resume_mode)
    resume: str = "none"
    #: save LoRA runs' model/ as full merged weights instead of the adapter
    merge_lora: bool = False


@dataclass
class Config:
    """A whole run: one section per part, and the seed."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rewards: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    #: seed of data order, sampling and initialisation, in [0, 2^32 - 1] (TRL: seed)
    seed: int = checked(0, Range(ge=0, le=2**32 - 1))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------------
# The reference: every leaf key with its type, default, range and doc line.


@dataclass(frozen=True)
class FieldDoc:
    """One leaf config key as documented: ``range`` is its rule's text ("" where none applies on its own)."""

    key: str
    type: str
    default: Any
    range: str
    doc: str


@functools.cache
def _doc_lines(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines directly above each field of a dataclass, read from its source."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    (node,) = ast.parse(source).body
    docs = {}
    for statement in typing.cast(ast.ClassDef, node).body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            above, row = [], statement.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                above.insert(0, lines[row].strip().removeprefix("#:").strip().replace("``", "`"))
                row -= 1
            docs[statement.target.id] = " ".join(above)
    return docs


def config_reference() -> list[FieldDoc]:
    """Every leaf key of :class:`Config` in declaration order (``train --help``, the reference page)."""
    out: list[FieldDoc] = []

    def walk(cls: type, instance: Any, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key, value = f"{prefix}{f.name}", getattr(instance, f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], value, f"{key}.")
                continue
            rule = f.metadata.get(_RULE)
            doc = _doc_lines(cls).get(f.name, "")
            out.append(FieldDoc(key, _type_name(hints[f.name]), value, rule.describe() if rule else "", doc))

    walk(Config, Config(), "")
    return out


# ---------------------------------------------------------------------------------------------------------
# Building typed dataclasses from plain data, with the dotted key in every error.

_shown = reprlib.Repr()  # values in messages stay short, however large (or deeply nested) they are
_shown.maxstring = _shown.maxother = 80
_shown.maxlist = _shown.maxdict = _shown.maxtuple = 8
_shown.maxlevel = 3
_INT64 = 2**63


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, dict):
        return str(tp).replace("typing.", "")
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


#: choices a peer names differently (TRL's loss_type, importance_sampling_level): the advice a refusal gives
PEER_CHOICES: dict[str, dict[str, str]] = {
    "algorithm.loss_aggregation": {
        "grpo": "TRL's loss_type 'grpo' is seq_mean_token_mean here",
        "dapo": "TRL's loss_type 'dapo' is token_mean here",
        "dr_grpo": "TRL's loss_type 'dr_grpo' is seq_mean_token_sum_norm here",
        "bnpo": "TRL's loss_type 'bnpo' normalises each micro-batch by its own token count, so its gradient "
        "depends on the micro-batching, which this trainer rules out; token_mean equals it without gradient "
        "accumulation (and equals TRL's dapo with it)",
    },
}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it (ints widen to float)."""
    origin = typing.get_origin(tp)
    shown = _shown.repr(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of settings, got {type(value).__name__} {shown}")
        return _build(tp, value, key)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed or isinstance(value, bool) != any(isinstance(a, bool) for a in allowed):
            advice = PEER_CHOICES.get(key, {}).get(value) if isinstance(value, str) else None
            raise ConfigError(
                f"{key}: must be {_type_name(tp)}, got {shown}" + (f" ({advice})" if advice else "")
            )
        return value
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            if option is type(None) and value is None:
                return None
            try:
                return _coerce(value, option, key)
            except ConfigError:
                continue
        raise ConfigError(
            f"{key}: must be {' or '.join(_type_name(a) for a in typing.get_args(tp))}, got {shown}"
        )
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: must be a list of {_type_name(item_tp)}, got {shown}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, item_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(
                f"{key}: must be a mapping of {_type_name(key_tp)} to {_type_name(item_tp)}, got {shown}"
            )
        return {_coerce(k, key_tp, key): _coerce(v, item_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false, got {shown}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer, got {shown}")
        if not -_INT64 <= value < _INT64:
            raise ConfigError(f"{key}: must be an integer that fits in 64 bits, got {shown}")
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-6 (no dot) as a string; accept what float() reads
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: must be a number, got {shown}")
        if isinstance(value, int) and abs(value) > 1e308:
            raise ConfigError(f"{key}: must be a finite number, got {shown}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string, got {shown}")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} at {key}")  # a bug in this module, not user input


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in names:
            close = difflib.get_close_matches(str(name), names, n=1)
            hint = f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)" if close else ""
            raise ConfigError(f"{_shown.repr(key)[1:-1]}: unknown key{hint}")
        kwargs[name] = _coerce(value, hints[name], key)
    return cls(**kwargs)


# ---------------------------------------------------------------------------------------------------------
# Reading YAML: a config is small, flat and written by hand, so what could only be a mistake or an attack is
# refused in one line — aliases (a few hundred bytes expand to gigabytes), deep nesting, non-UTF-8 text —
# and `010` is ten (as in YAML 1.2), not YAML 1.1's octal eight.

MAX_YAML_DEPTH = 32  # the deepest config key is 4 levels (rewards.options.<name>.<option>)


class _YAMLRefused(yaml.YAMLError):
    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases, with bounded nesting, leading-zero integers read as decimal."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _YAMLRefused(
                f"aliases (*{event.anchor}) are not accepted in a run config; write the value out",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _YAMLRefused(
                    f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> int:
        text = str(self.construct_scalar(node)).replace("_", "")
        digits = text.lstrip("+-")
        if len(digits) > 1 and digits[0] == "0" and digits.isdigit():
            return int(text, 10)  # YAML 1.1 reads 010 as octal 8; a config means ten
        return super().construct_yaml_int(node)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)


def _load_yaml(text: str, source: str) -> Any:
    """Parse YAML text with the config loader; any problem is one ConfigError line naming ``source``."""
    try:
        loader = _ConfigLoader(text)  # its reader refuses control characters at once
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _YAMLRefused as err:
        raise ConfigError(f"{source}: line {err.problem_mark.line + 1}: {err.problem}") from None
    except yaml.reader.ReaderError as err:
        raise ConfigError(
            f"{source}: not valid YAML: character #x{err.character:04x} at position {err.position}: "
            f"{err.reason}"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"{source}: not valid YAML{where}: {getattr(err, 'problem', None) or err}"
        ) from None


def _parse_override(text: str) -> tuple[list[str], Any]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 arrive from argv as lone surrogates
        raise ConfigError(f"{ascii(text)}: an override must be UTF-8 text") from None
    if "=" not in text:
        raise ConfigError(f"{text}: overrides are written key=value, e.g. rollout.num_thoughts=4")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{text}: the key before '=' is empty or malformed")
    if not raw.strip():
        return key.split("."), ""
    try:
        value = _load_yaml(raw, key)
    except ConfigError as err:
        reason = str(err).removeprefix(f"{key}: ")
        raise ConfigError(f"{key}: cannot parse override value {_shown.repr(raw)}: {reason}") from None
    return key.split("."), value


def _set_dotted(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"{'.'.join(parts[: i + 1])}: is a value, not a section; cannot set {'.'.join(parts)}"
            )
        node = child
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file (optional), apply ``key=value`` overrides, build and validate the config."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at {err.start})"
            ) from None
        except OSError as err:
            raise ConfigError(f"{path}: cannot read the config: {err.strerror or err}") from None
        loaded = _load_yaml(text, str(path))
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"{path}: the top level must be a mapping of sections, got {type(loaded).__name__}"
            )
        tree = loaded
    return config_from_dict(tree, overrides)


def config_from_dict(tree: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build and validate a config from plain data (e.g. ``Config.to_dict()``) and ``key=value`` overrides."""
    tree = copy.deepcopy(tree)
    for text in overrides:
        parts, value = _parse_override(text)
        _set_dotted(tree, parts, value)
    config = _build(Config, tree)
    validate(config)
    return config


# ---------------------------------------------------------------------------------------------------------
# Checks: every field's own rule, then the rules between fields.

#: K x M answers per prompt at most: 64 x 64 is beyond any published GRPO(-MA) setting; K = M = 1000 asked
#: the rollout for a 23 GB allocation before anything said why
MAX_ANSWERS_PER_PROMPT = 4096


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def check_fields(section: Any, prefix: str = "") -> None:
    """Apply each field's own rule (its ``Range`` or ``NonEmpty`` metadata), sections recursively."""
    for f in dataclasses.fields(section):
        value, key = getattr(section, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_fields(value, f"{key}.")
        elif (rule := f.metadata.get(_RULE)) is not None and not rule.allows(value):
            raise ConfigError(f"{key}: {rule.complaint(value)}")


def validate(config: Config, world_size: int | None = None) -> None:
    """Each field's own rule, then the rules between fields; ``world_size`` adds the per-rank batch split."""
    check_fields(config)
    r, t = config.rollout, config.train
    _require(
        r.num_thoughts >= 2,
        "rollout.num_thoughts",
        f"must be >= 2 (advantages compare the K thoughts of a prompt), got {r.num_thoughts}",
    )
    _require(
        r.answers_per_thought >= 1,
        "rollout.answers_per_thought",
        f"must be >= 1, got {r.answers_per_thought}",
    )
    _require(
        r.temperature == 0 or r.temperature >= 0.01,
        "rollout.temperature",
        f"must be 0 (greedy) or >= 0.01 (smaller ones overflow the logits; vLLM raises them to 0.01), "
        f"got {r.temperature}",
    )
    _require(0 < r.top_p <= 1, "rollout.top_p", f"must be in (0, 1], got {r.top_p}")
    _require(r.top_k >= 0, "rollout.top_k", f"must be >= 0 (0 disables it), got {r.top_k}")
    _require(
        r.max_thought_tokens >= 1, "rollout.max_thought_tokens", f"must be >= 1, got {r.max_thought_tokens}"
    )
    _require(
        r.max_answer_tokens >= 1, "rollout.max_answer_tokens", f"must be >= 1, got {r.max_answer_tokens}"
    )
    _require(
        r.num_thoughts * r.answers_per_thought <= MAX_ANSWERS_PER_PROMPT,
        "rollout.num_thoughts",
        f"x rollout.answers_per_thought = {r.num_thoughts} x {r.answers_per_thought} = "
        f"{r.num_thoughts * r.answers_per_thought} answers per prompt; at most {MAX_ANSWERS_PER_PROMPT}",
    )
    for name in config.rewards.options:
        _require(
            name in config.rewards.weights,
            f"rewards.options.{name}",
            f"options for a reward that is not in rewards.weights ({', '.join(config.rewards.weights)})",
        )
    _require(
        t.logprob_pass == "naive" or config.model.attn_implementation in ("sdpa", "eager", "flex_attention"),
        "train.logprob_pass",
        f"'shared' needs model.attn_implementation sdpa, eager (a 4-D attention mask) or flex_attention "
        f"(a block mask), got {config.model.attn_implementation!r}; use train.logprob_pass=naive",
    )
    _require(
        t.eval_every == 0 or bool(config.data.eval_sets),
        "data.eval_sets",
        f"is empty but train.eval_every={t.eval_every}; name the held-out records, e.g. {{test: test.jsonl}}",
    )
    _require(
        config.model.min_pixels <= config.model.max_pixels,
        "model.min_pixels",
        f"({config.model.min_pixels}) must not exceed model.max_pixels ({config.model.max_pixels})",
    )
    world = world_size or 1
    _require(
        t.prompts_per_step % world == 0,
        "train.prompts_per_step",
        f"{t.prompts_per_step} prompts per step do not divide across {world} ranks",
    )
    per_rank = t.prompts_per_step // world
    _require(
        per_rank % t.micro_batch_prompts == 0,
        "train.micro_batch_prompts",
        f"{t.micro_batch_prompts} does not divide the {per_rank} prompts each of {world} rank(s) gets per step "
        f"(train.prompts_per_step={t.prompts_per_step})",
    )


def gradient_accumulation_steps(config: Config, world_size: int) -> int:
    """Micro-batches per optimizer step on each rank (validated to divide exactly)."""
    validate(config, world_size)
    return config.train.prompts_per_step // world_size // config.train.micro_batch_prompts


# ---------------------------------------------------------------------------------------------------------
# Optional packages the config asks for, found (not imported) before any model loads.

#: the commands that sample rollouts (rollout.backend) and those that log a run (logging.wandb_project)
_ROLLOUT_COMMANDS = ("train",)
_LOGGING_COMMANDS = ("train", "sft")


def check_optional_dependencies(config: Config, command: str) -> None:
    """Raise one line naming the key when ``command`` would need a package this environment lacks.

    vLLM for ``rollout.backend=vllm`` (train), wandb for ``logging.wandb_project`` (train, sft). No config key
    needs pyarrow (only ``convert --from parquet``, which checks it first) or pycocotools (``eval`` skips COCO
    AP with a note without it)."""
    if command in _ROLLOUT_COMMANDS and config.rollout.backend == "vllm" and not _installed("vllm"):
        raise MissingDependencyError(
            "rollout.backend=vllm needs vLLM, which is not installed here: on a CUDA machine install the "
            "vllm extra (pip install './vlm-grpoma[vllm]'), on CPU run `make setup-vllm`; "
            "or use rollout.backend=hf"
        )
    if command in _LOGGING_COMMANDS and config.logging.wandb_project and not _installed("wandb"):
        raise MissingDependencyError(
            f"logging.wandb_project={config.logging.wandb_project} needs wandb, which is not installed here: "
            "pip install wandb, or leave logging.wandb_project empty"
        )


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
