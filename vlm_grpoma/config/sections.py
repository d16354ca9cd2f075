"""The config's sections as typed dataclasses; a ``#:`` line above each leaf field documents it (tested)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from vlm_grpoma.config.rules import _RULE, NonEmpty, PromptTemplates, Range, checked


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
    #: most images one prompt may show (records with "images"); each costs up to max_pixels / 28^2 tokens,
    #: and vLLM reserves memory for this many per prompt, so set it to what the data holds (check-data says)
    #: (vLLM: limit_mm_per_prompt.image; EasyR1: data.limit_images)
    max_images: int = checked(1, Range(ge=1))
    #: most frames a record's video may have (records with "video"); 0: no videos. A video costs frames / 2
    #: times one frame's tokens (frames are resized within min_pixels-max_pixels like images), and vLLM
    #: reserves memory for one video per prompt when this is set (vLLM: limit_mm_per_prompt.video)
    max_video_frames: int = checked(0, Range(ge=0, note="0: no videos"))
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
    #: training uses only the records of this task and split (converters may write several splits to one file);
    #: answer: short text answers (text-only or with an image), scored by the answer_match reward
    task: Literal["detection", "affordance", "trajectory", "manipulation", "answer"] = "detection"
    #: the split of data.train_path to train on (records carry a split name)
    train_split: str = "train"
    #: a record whose whole prompt (chat template, instruction and image tokens) is longer is refused when the
    #: records are loaded (or skipped with skip_bad_records); tokens, >= 0, 0: no limit
    #: (TRL: max_prompt_length, verl: data.max_prompt_length, but prompts are never cut here)
    max_prompt_tokens: int = checked(4096, Range(ge=0, note="0: no limit"))
    #: leave out (with one warning line) the records that fail validation, their images included; else the
    #: first one is an error
    skip_bad_records: bool = False
    #: a folder every record's image and mask must lie under (symlinks followed), for records files you did not
    #: write; empty: anywhere
    image_root: str = ""
    #: reshuffle the training records every epoch (seeded by `seed`)
    #: (TRL: shuffle_dataset; verl: data.shuffle)
    shuffle: bool = True
    #: task -> the lead of each record's instruction, a str.format template over the record's fields
    #: ({prompt}, {id}, {width}, {height}, {split}, meta keys), e.g. {detection: "Locate {prompt}."}; the answer
    #: shape and coordinate frame still follow it; empty: ours ("Find {prompt}.")
    prompt_template: dict[str, str] = field(default_factory=dict, metadata={_RULE: PromptTemplates()})
    #: replaces the think/answer system instruction (model.prompt_style=full); empty: ours
    system_prompt: str = ""


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
class RolloutServerConfig:
    """The rollout servers of `rollout.backend=vllm_server` (`vlm-grpoma rollout-server`, vLLM on other GPUs or
    nodes): trainer rank r samples from urls[r % len(urls)]."""

    #: server addresses, e.g. [http://10.0.0.5:8400]; one or more (TRL: vllm_server_host/port; verl: rollout
    #: server addresses)
    urls: list[str] = field(default_factory=list)
    #: longest wait for one server reply (a rollout, a weight push) in seconds before the run stops with a line
    #: naming the server; > 0 (TRL: vllm_server_timeout)
    timeout_s: float = checked(600.0, Range(gt=0, cap=1e6))
    #: file holding the secret shared with the servers (`openssl rand -hex 32 > F; chmod 600 F`): every request
    #: is signed with it and a server started with the same file refuses unsigned ones; empty: no token (the
    #: server then listens on loopback only)
    token_file: str = ""


@dataclass
class AdaptiveAnswersConfig:
    """Answers per thought allocated from the first answers' rewards (Neyman, ``algorithm/allocation.py``)."""

    #: on: sample `first` answers per thought, score them, then give the rest of `budget` to the thoughts
    #: whose rewards spread most; rollout.answers_per_thought is then unused (held-out eval is greedy)
    enabled: bool = False
    #: answers sampled per thought before allocating, >= 2 (a spread needs two)
    first: int = checked(2, Range(ge=2, cap=4096))
    #: answers per prompt in all, the sum of the K per-thought counts: K x first (no extra answers), or
    #: >= K x (first + 1), every thought then getting at least one extra (the thought values stay unbiased)
    budget: int = checked(16, Range(ge=2, cap=4096))
    #: fewest answers a thought gets, >= 1 (at least `first` in effect)
    min_per_thought: int = checked(2, Range(ge=1, cap=4096))
    #: most answers a thought gets, >= min_per_thought and >= first; K x max >= budget
    max_per_thought: int = checked(8, Range(ge=1, cap=4096))


@dataclass
class RolloutConfig:
    """Two-phase sampling: K thoughts per prompt, then M answers continuing each thought.

    The sampling ranges below are checked in :func:`validate` by the rollout's own sampling rules.
    """

    #: sampler: hf (a transformers sampling loop, any machine), vllm (a colocated vLLM engine, needs vLLM) or
    #: vllm_server (vLLM servers elsewhere, rollout.server; TRL: vllm_mode=server) (TRL: use_vllm; verl:
    #: rollout.name)
    backend: Literal["hf", "vllm", "vllm_server"] = "hf"
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
    adaptive_answers: AdaptiveAnswersConfig = field(default_factory=AdaptiveAnswersConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    server: RolloutServerConfig = field(default_factory=RolloutServerConfig)

    def answers_per_prompt(self) -> int:
        """Answers one prompt's tree trains on: K x M, or the adaptive budget (what memory plans size)."""
        if self.adaptive_answers.enabled:
            return self.adaptive_answers.budget
        return self.num_thoughts * self.answers_per_thought


@dataclass
class RolloutCorrectionConfig:
    """Importance weights for the rollout/trainer log-prob mismatch (``vlm_grpoma/algorithm/rollout_correction.py``)."""

    #: "tis": min(π_old/π_rollout, cap) per token (TRL vllm_importance_sampling_correction, token_truncate);
    #: "mis": ratio, with tokens (or segments) whose ratio exceeds cap dropped (TRL *_mask modes);
    #: "mis_two_sided": also those below 1/cap (verl's MIS); "none";
    #: "auto": tis with the vllm backend, none with hf (its log-probs are the trainer's to float precision)
    mode: Literal["auto", "none", "tis", "mis", "mis_two_sided"] = "auto"
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
class RewardNoiseConfig:
    """An experimental control, not a training feature: training rewards made noisy given the answer, so the
    answer-sampling noise the GRPO-MA theory is about can be dialled in (benchmarks/compare.py --plan
    crossover). Held-out scores are never noisy."""

    #: probability, in [0, 0.5], that the training score s in [0, 1] of rewards.noise.reward becomes 1 - s
    #: (drawn per sampled answer; 0: off)
    flip: float = checked(0.0, Range(ge=0, le=0.5))
    #: the reward in rewards.weights whose score is flipped
    reward: str = "answer_match"


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
    #: flip training scores at random (an experimental control; held-out scores stay clean)
    noise: RewardNoiseConfig = field(default_factory=RewardNoiseConfig)


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
class AsyncRolloutConfig:
    """One step off: the next step's rollout runs on the rollout server while this step trains
    (``rollout.backend=vllm_server`` only; ``trainer/async_rollout.py``). The key is not ``train.async``:
    ``async`` is a Python keyword, so that name could not be a config field or a keyword argument."""

    #: on: sample step t+1 while step t trains; its tokens come from weights one step (policy_epochs versions)
    #: old, which algorithm.rollout_correction corrects (verl: one_step_off_policy; AReaL, slime)
    enabled: bool = False
    #: weight versions (optimizer steps) a prefetched rollout may lag the trained weights by, >= 0; one lagging
    #: more is sampled again with the current weights (one step off lags by algorithm.policy_epochs); 0: no
    #: rollout is prefetched, the synchronous loop exactly (TRL AsyncGRPO: max_staleness)
    max_staleness: int = checked(1, Range(ge=0, cap=1000))

    @property
    def prefetches(self) -> bool:
        """The next step's rollout is requested before this step trains."""
        return self.enabled and self.max_staleness > 0


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
    async_rollout: AsyncRolloutConfig = field(default_factory=AsyncRolloutConfig)


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
    #: none: start fresh (refuses a folder holding another run); auto: the newest intact checkpoint of
    #: output_dir, if any (refuses when only damaged ones are left); restart: step 0 in a folder holding a run
    #: (its checkpoints moved to abandoned-step-*, metrics.jsonl cleared); or a step-N folder
    #: (TRL: resume_from_checkpoint; verl: trainer.resume_mode)
    resume: str = "none"
    #: resume a checkpoint saved at another world size (or ZeRO stage 1 <-> 2) with its optimizer state,
    #: through DeepSpeed's universal checkpoint (step-N/universal/; same prompts per step, not bitwise);
    #: false: refuse it (exact resume only) (DeepSpeed: checkpoint.load_universal)
    elastic_resume: bool = True
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
