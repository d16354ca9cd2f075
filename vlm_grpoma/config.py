"""Typed run configuration: dataclasses, YAML loading, dotted ``key=value`` overrides, validation.

Everything here is cheap to import (no torch), so a bad config fails in well under a second, before any
model, dataset or process group is touched. Every error is one line that names the offending key.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from vlm_grpoma.errors import ConfigError

__all__ = ["Config", "ConfigError", "config_from_dict", "load_config", "validate"]


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@dataclass
class ModelConfig:
    """Which checkpoint to train and how to load it."""

    name_or_path: str = ""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flex_attention"] = "sdpa"
    trust_remote_code: bool = False
    min_pixels: int = 56 * 56
    max_pixels: int = 448 * 448
    #: "full": system instruction + detailed answer format (real checkpoints); "compact": a one-line instruction,
    #: ~3x shorter prompts for tiny models that learn the format from SFT (the CPU demo).
    prompt_style: Literal["full", "compact"] = "full"
    #: Who opens the thought: "auto" follows the chat template (Qwen3-VL Thinking releases end the generation
    #: prompt with "<think>\n", so the model starts inside the thought); "opened" makes the prompt open it,
    #: "closed" leaves "<think>" to the model, whatever the template does.
    thinking: Literal["auto", "opened", "closed"] = "auto"
    freeze_vision: bool = True
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class DataConfig:
    train_path: str = ""
    eval_path: str = ""
    #: held-out sets scored during GRPO-MA training every ``train.eval_every`` steps, name -> records.jsonl
    #: (records of ``data.task``, any split), e.g. {seen: data/seen.jsonl, unseen: data/unseen.jsonl}
    eval_sets: dict[str, str] = field(default_factory=dict)
    #: training uses only the records of this task and split (converters may write several splits to one file)
    task: Literal["detection", "affordance", "trajectory", "manipulation"] = "detection"
    train_split: str = "train"
    #: a record whose whole prompt (chat template, instruction and image tokens) is longer is refused when the
    #: records are loaded (or skipped with skip_bad_records); 0: no limit
    max_prompt_tokens: int = 4096
    #: leave out (with one warning line) the records that fail validation, their images included; else the
    #: first one is an error
    skip_bad_records: bool = False
    shuffle: bool = True


@dataclass
class VLLMConfig:
    """The colocated vLLM engine of ``rollout.backend=vllm`` (a CUDA or a CPU build of vLLM)."""

    gpu_memory_utilization: float = 0.3  # CPU build: the share of the machine's RAM
    tensor_parallel_size: int = 1
    enable_sleep_mode: bool = False  # not supported by the CPU build
    max_model_len: int = 0  # 0: the model's own limit
    enforce_eager: bool = False
    block_size: int = 0  # KV/prefix-cache block in tokens; 0: 32 on CPU, vLLM's default on CUDA
    kv_cache_gib: float = 0.0  # KV cache size; 0: from gpu_memory_utilization


@dataclass
class RolloutConfig:
    """Two-phase sampling: K thoughts per prompt, then M answers continuing each thought."""

    backend: Literal["hf", "vllm"] = "hf"
    num_thoughts: int = 4
    answers_per_thought: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_thought_tokens: int = 256
    max_answer_tokens: int = 64
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class AlgorithmConfig:
    """GRPO-MA advantages and the clipped policy objective (see ``vlm_grpoma/algorithm``)."""

    advantage_scale: Literal["std", "none"] = "std"
    advantage_eps: float = 1e-4
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_beta: float = 0.04
    loss_aggregation: Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"] = (
        "seq_mean_token_mean"
    )
    thought_loss_weight: float = 1.0
    policy_epochs: int = 1
    #: "k3": the per-token k3 estimator of KL(policy || reference) (TRL with use_bias_correction_kl=False);
    #: "k3_ratio": k3 times the importance ratio, differentiable (TRL's use_bias_correction_kl=True)
    kl_estimator: Literal["k3", "k3_ratio"] = "k3"


@dataclass
class RewardConfig:
    """Reward functions by registered name, each with its weight in the total reward."""

    weights: dict[str, float] = field(default_factory=lambda: {"iou": 1.0, "format": 0.5})
    #: constructor options per reward, e.g. {iou: {mode: giou}, manipulation: {workers: 2, timeout_s: 5}}
    options: dict[str, dict[str, bool | int | float | str]] = field(default_factory=dict)


@dataclass
class OptimConfig:
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    max_grad_norm: float = 1.0


@dataclass
class TrainConfig:
    """Batch arithmetic: prompts per optimizer step (global), split across ranks and micro-batches."""

    steps: int = 100
    prompts_per_step: int = 8
    micro_batch_prompts: int = 1
    #: token budget of one micro-batch (0: off, micro-batches of micro_batch_prompts prompts): prompts are grouped
    #: so that rows x longest row (shared pass: one packed row per prompt; naive: K*M path rows) stays within it;
    #: a prompt over the budget alone gets its own micro-batch. verl: ppo_max_token_len_per_gpu
    micro_batch_tokens: int = 0
    #: "shared": image + prompt once per prompt and each thought once for its M answers (one packed row per
    #: prompt; needs sdpa/eager attention (4-D mask) or flex_attention (block mask)); "naive": one row per path.
    logprob_pass: Literal["shared", "naive"] = "shared"
    #: score greedy answers on ``data.eval_sets`` with the training rewards before step 1, every this many
    #: steps and after the last step (0: never)
    eval_every: int = 0
    eval_batch_prompts: int = 16
    #: stop once the training steps (rollout, rewards, update; not evaluation or checkpoints) have taken this
    #: many seconds in all (0: no budget; ``train.steps`` stays the upper bound). Compares arms at equal time.
    time_budget_s: float = 0.0
    #: seconds a rank waits in a collective (or at start-up for the others) before the job ends naming it
    dist_timeout_s: float = 600.0


@dataclass
class DeepSpeedConfig:
    zero_stage: Literal[0, 1, 2, 3] = 2
    config_file: str = ""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    offload_optimizer: bool = False
    dist_backend: Literal["auto", "nccl", "gloo"] = "auto"


@dataclass
class LoggingConfig:
    output_dir: str = "runs/default"
    log_every: int = 1
    tensorboard: bool = True
    wandb_project: str = ""
    progress_bar: bool = True
    #: every this many GRPO-MA steps, write ``samples`` of rank 0's completions (texts and rewards) to
    #: samples.jsonl and TensorBoard text (0: never)
    samples_every: int = 10
    samples: int = 4


@dataclass
class CheckpointConfig:
    save_every: int = 0
    keep_last: int = 2
    resume: str = "none"
    merge_lora: bool = False


@dataclass
class Config:
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
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------------
# Building typed dataclasses from plain data, with the dotted key in every error.


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, dict):
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it (ints widen to float)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of settings, got {type(value).__name__} {value!r}")
        return _build(tp, value, key)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed or isinstance(value, bool) != any(isinstance(a, bool) for a in allowed):
            raise ConfigError(f"{key}: must be {_type_name(tp)}, got {value!r}")
        return value
    if origin in (Union, types.UnionType):
        errors = []
        for option in typing.get_args(tp):
            if option is type(None) and value is None:
                return None
            try:
                return _coerce(value, option, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(
            f"{key}: must be {' or '.join(_type_name(a) for a in typing.get_args(tp))}, got {value!r}"
        )
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: must be a list of {_type_name(item_tp)}, got {value!r}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, item_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(
                f"{key}: must be a mapping of {_type_name(key_tp)} to {_type_name(item_tp)}, got {value!r}"
            )
        return {_coerce(k, key_tp, key): _coerce(v, item_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-6 (no dot) as a string; accept what float() reads
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string, got {value!r}")
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
            raise ConfigError(f"{key}: unknown key{hint}")
        kwargs[name] = _coerce(value, hints[name], key)
    return cls(**kwargs)


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"{text}: overrides are written key=value, e.g. rollout.num_thoughts=4")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{text}: the key before '=' is empty or malformed")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"{key}: cannot parse override value {raw!r}: {err.problem}") from None
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
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', err)}") from None
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


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def validate(config: Config, world_size: int | None = None) -> None:
    """Range and consistency checks; ``world_size`` adds the per-rank batch arithmetic."""
    r, a, t, o = config.rollout, config.algorithm, config.train, config.optim
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
    _require(r.temperature >= 0, "rollout.temperature", f"must be >= 0, got {r.temperature}")
    _require(0 < r.top_p <= 1, "rollout.top_p", f"must be in (0, 1], got {r.top_p}")
    _require(r.top_k >= 0, "rollout.top_k", f"must be >= 0 (0 disables it), got {r.top_k}")
    _require(
        r.max_thought_tokens >= 1, "rollout.max_thought_tokens", f"must be >= 1, got {r.max_thought_tokens}"
    )
    _require(
        r.max_answer_tokens >= 1, "rollout.max_answer_tokens", f"must be >= 1, got {r.max_answer_tokens}"
    )
    _require(
        0 < r.vllm.gpu_memory_utilization <= 1,
        "rollout.vllm.gpu_memory_utilization",
        f"must be in (0, 1], got {r.vllm.gpu_memory_utilization}",
    )
    _require(
        r.vllm.tensor_parallel_size >= 1,
        "rollout.vllm.tensor_parallel_size",
        f"must be >= 1, got {r.vllm.tensor_parallel_size}",
    )
    _require(
        r.vllm.max_model_len >= 0, "rollout.vllm.max_model_len", f"must be >= 0, got {r.vllm.max_model_len}"
    )
    _require(r.vllm.block_size >= 0, "rollout.vllm.block_size", f"must be >= 0, got {r.vllm.block_size}")
    _require(
        r.vllm.kv_cache_gib >= 0, "rollout.vllm.kv_cache_gib", f"must be >= 0, got {r.vllm.kv_cache_gib}"
    )
    _require(a.advantage_eps >= 0, "algorithm.advantage_eps", f"must be >= 0, got {a.advantage_eps}")
    _require(0 <= a.clip_eps_low < 1, "algorithm.clip_eps_low", f"must be in [0, 1), got {a.clip_eps_low}")
    _require(a.clip_eps_high >= 0, "algorithm.clip_eps_high", f"must be >= 0, got {a.clip_eps_high}")
    _require(a.kl_beta >= 0, "algorithm.kl_beta", f"must be >= 0, got {a.kl_beta}")
    _require(
        a.thought_loss_weight >= 0,
        "algorithm.thought_loss_weight",
        f"must be >= 0, got {a.thought_loss_weight}",
    )
    _require(a.policy_epochs >= 1, "algorithm.policy_epochs", f"must be >= 1, got {a.policy_epochs}")
    _require(bool(config.rewards.weights), "rewards.weights", "needs at least one reward function")
    for name in config.rewards.options:
        _require(
            name in config.rewards.weights,
            f"rewards.options.{name}",
            f"options for a reward that is not in rewards.weights ({', '.join(config.rewards.weights)})",
        )
    _require(o.learning_rate > 0, "optim.learning_rate", f"must be > 0, got {o.learning_rate}")
    _require(o.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {o.weight_decay}")
    _require(o.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0, got {o.warmup_steps}")
    _require(
        o.max_grad_norm >= 0,
        "optim.max_grad_norm",
        f"must be >= 0 (0 disables clipping), got {o.max_grad_norm}",
    )
    _require(t.steps >= 1, "train.steps", f"must be >= 1, got {t.steps}")
    _require(t.prompts_per_step >= 1, "train.prompts_per_step", f"must be >= 1, got {t.prompts_per_step}")
    _require(
        t.micro_batch_prompts >= 1, "train.micro_batch_prompts", f"must be >= 1, got {t.micro_batch_prompts}"
    )
    _require(
        t.micro_batch_tokens >= 0,
        "train.micro_batch_tokens",
        f"must be >= 0 (0: off), got {t.micro_batch_tokens}",
    )
    _require(
        t.logprob_pass == "naive" or config.model.attn_implementation in ("sdpa", "eager", "flex_attention"),
        "train.logprob_pass",
        f"'shared' needs model.attn_implementation sdpa, eager (a 4-D attention mask) or flex_attention "
        f"(a block mask), got {config.model.attn_implementation!r}; use train.logprob_pass=naive",
    )
    _require(
        t.eval_every >= 0, "train.eval_every", f"must be >= 0 (0 disables evaluation), got {t.eval_every}"
    )
    _require(
        t.eval_batch_prompts >= 1, "train.eval_batch_prompts", f"must be >= 1, got {t.eval_batch_prompts}"
    )
    _require(t.dist_timeout_s > 0, "train.dist_timeout_s", f"must be > 0 seconds, got {t.dist_timeout_s}")
    _require(
        config.data.max_prompt_tokens >= 0,
        "data.max_prompt_tokens",
        f"must be >= 0 (0: no limit), got {config.data.max_prompt_tokens}",
    )
    _require(
        math.isfinite(t.time_budget_s) and t.time_budget_s >= 0,
        "train.time_budget_s",
        f"must be a finite number of seconds >= 0 (0: no budget), got {t.time_budget_s}",
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
    _require(
        config.logging.log_every >= 1, "logging.log_every", f"must be >= 1, got {config.logging.log_every}"
    )
    _require(
        config.logging.samples_every >= 0,
        "logging.samples_every",
        f"must be >= 0 (0 logs no samples), got {config.logging.samples_every}",
    )
    _require(config.logging.samples >= 1, "logging.samples", f"must be >= 1, got {config.logging.samples}")
    _require(
        bool(config.logging.output_dir.strip()),
        "logging.output_dir",
        "is empty: name the folder that receives metrics and checkpoints, e.g. runs/my-run",
    )
    _require(
        config.checkpoint.save_every >= 0, "checkpoint.save_every", "must be >= 0 (0 saves only at the end)"
    )
    _require(
        config.checkpoint.keep_last >= 1,
        "checkpoint.keep_last",
        f"must be >= 1, got {config.checkpoint.keep_last}",
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
