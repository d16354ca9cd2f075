"""Per-GPU memory of a training run, by formula; every assumption is in :data:`~vlm_grpoma.planning.assumptions.ASSUMPTIONS`
(printed by ``vlm-grpoma plan --help`` and the README)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlm_grpoma.config import Config, ConfigError
from vlm_grpoma.planning.model_stats import ModelStats

GIB = 2**30
#: Prompt text tokens (system prompt, instruction, answer format, frame, chat markup), per prompt style.
PROMPT_TEXT_TOKENS = {"full": 200, "compact": 70}
CUDA_RESERVE_BYTES = GIB
FRAGMENTATION = 0.10


@dataclass(frozen=True)
class Hardware:
    """The machines a plan is for: GPUs per node, nodes, memory per GPU (2^30 bytes); ``device`` cpu plans a
    CPU run (fp32, no CUDA reserve) with ``gpu_mem_gb`` the RAM available to each rank."""

    gpus_per_node: int = 1
    nodes: int = 1
    gpu_mem_gb: float = 80.0
    device: str = "gpu"

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Shapes:
    """Token counts at the config's budget maxima."""

    image_tokens: int
    prompt_tokens: int
    packed_row: int  # one shared-prefix row
    naive_row: int  # one path row (prompt + thought + answer)
    prompts_per_rank: int


@dataclass
class MemoryPlan:
    """Per-GPU bytes by component, the peak, and what the GPU offers for training."""

    precision: str
    states: dict[str, float]
    training_pass: dict[str, float]
    rollout: dict[str, float]
    reserve: float
    train_peak_without_checkpointing: float
    train_peak_with_checkpointing: float
    capacity: float  # the GPU's memory
    vllm_share: float  # reserved for vLLM (rollout.backend vllm)
    shapes: Shapes
    cpu_offload_bytes: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        """Training's peak: model states + the larger of rollout and training pass + reserve."""
        return (
            sum(self.states.values())
            + max(sum(self.training_pass.values()), sum(self.rollout.values()))
            + self.reserve
        )

    @property
    def available(self) -> float:
        return self.capacity - self.vllm_share

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    @property
    def margin(self) -> float:
        """Bytes to spare (negative: short by that much)."""
        return self.available - self.total


def precision_of(config: Config, device: str) -> str:
    """fp32 / bf16 / fp16 the run trains in; ``auto`` on a GPU plans bf16 (Ampere or newer)."""
    precision, dtype = config.deepspeed.precision, config.model.dtype
    if precision != "auto":
        return precision
    if dtype != "auto":
        return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype]
    return "bf16" if device == "gpu" else "fp32"


def shapes(config: Config, stats: ModelStats, world_size: int) -> Shapes:
    """Token counts of the longest prompt, packed row and path row the config allows."""
    factor = stats.family.factor
    image_tokens = max(config.model.max_pixels // (factor * factor), 1)
    prompt = image_tokens + PROMPT_TEXT_TOKENS[config.model.prompt_style]
    r = config.rollout
    k, lt, la = r.num_thoughts, r.max_thought_tokens, r.max_answer_tokens
    return Shapes(
        image_tokens=image_tokens,
        prompt_tokens=prompt,
        packed_row=prompt + k * lt + r.answers_per_prompt() * la,
        naive_row=prompt + lt + la,
        prompts_per_rank=max(config.train.prompts_per_step // world_size, 1),
    )


def _zero_json(config: Config) -> dict[str, Any]:
    """The ``zero_optimization`` section the run will use (its bucket sizes)."""
    from vlm_grpoma.trainer.deepspeed_config import SHIPPED_DEEPSPEED_CONFIGS

    stage = config.deepspeed.zero_stage
    if config.deepspeed.config_file:
        text = Path(config.deepspeed.config_file).read_text()
    else:
        text = (SHIPPED_DEEPSPEED_CONFIGS / f"zero{2 if stage == 1 else stage}.json").read_text()
    return json.loads(text).get("zero_optimization", {})


def _mixed_precision_trainable(config: Config, stats: ModelStats, hw: Hardware) -> tuple[float, float, str]:
    """(GPU bytes, CPU bytes, source) of the trainable parameters' states in bf16/fp16 with fp32 master."""
    from vlm_grpoma.distributed import import_deepspeed

    stage, offload, t, n = (
        config.deepspeed.zero_stage,
        config.deepspeed.offload_optimizer,
        stats.trainable,
        hw.world_size,
    )
    import_deepspeed()
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if stage == 3:
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            t, stats.largest_layer, hw.gpus_per_node, hw.nodes, cpu_offload=offload, cpu_offload_params=False
        )
        return float(gpu), float(cpu) if offload else 0.0, "DeepSpeed estimate_zero3_model_states_mem_needs"
    if stage == 2 or offload:  # ZeRO-1 with offload runs the ZeRO-2 optimizer's offload path
        cpu, gpu = estimate_zero2_model_states_mem_needs(t, hw.gpus_per_node, hw.nodes, cpu_offload=offload)
        return float(gpu), float(cpu) if offload else 0.0, "DeepSpeed estimate_zero2_model_states_mem_needs"
    if stage == 1:
        return 4 * t + 16 * t / n, 0.0, "4T + 16T/N (ZeRO-1)"
    return 8 * t + 12 * t / n, 0.0, "8T + 12T/N (DeepSpeed BF16 optimizer, ZeRO-0)"


def _fp32_trainable(config: Config, stats: ModelStats, hw: Hardware) -> tuple[float, float, str]:
    """(GPU bytes, CPU bytes, formula) of the trainable parameters' states in fp32."""
    stage, offload, t, n = (
        config.deepspeed.zero_stage,
        config.deepspeed.offload_optimizer,
        stats.trainable,
        hw.world_size,
    )
    weights = 4 * t / n + 4 * stats.largest_layer if stage == 3 else 4 * t
    grads = 4 * t / n if stage >= 2 else 4 * t
    adam = 8 * t / n if stage >= 1 else 8 * t
    master = 4 * t / n if stage in (1, 2) else 0.0  # ZeRO-3 optimises fp32 partitions in place
    if offload:
        return (
            weights + grads,
            adam + 4 * t / n,
            "fp32: weights + grads on the device, master + AdamW offloaded",
        )
    return weights + grads + adam + master, 0.0, "fp32: 4 (weights) + 4 (grads) + 8 (AdamW) [+ 4 ZeRO master]"


def model_state_bytes(
    config: Config, stats: ModelStats, hw: Hardware, w: int
) -> tuple[dict[str, float], float, str]:
    """Per-GPU bytes of the model states by part, the CPU bytes of an offloaded optimizer, and the formula of
    the trainable part."""
    stage, n = config.deepspeed.zero_stage, hw.world_size
    frozen, total = stats.total - stats.trainable, stats.total
    compute = _mixed_precision_trainable if w == 2 else _fp32_trainable
    trainable, cpu, source = compute(config, stats, hw)
    states = {
        "trainable: weights, grads, optimizer": trainable,
        "frozen weights": w * frozen / n if stage == 3 else float(w * frozen),
    }
    if config.algorithm.kl_beta > 0 and not config.model.lora.enabled:
        states["reference model"] = w * total / n if stage == 3 else float(w * total)
    if stage >= 2:
        zero = _zero_json(config)
        keys = (
            ("stage3_prefetch_bucket_size",)
            if stage == 3
            else ("reduce_bucket_size", "allgather_bucket_size")
        )
        states["communication buckets"] = float(sum(min(float(zero.get(k, 5e8)), total) * w for k in keys))
    return states, cpu, source


def activation_bytes_per_token(stats: ModelStats, w: int, lora_dropout: bool) -> float:
    """Saved activations of one token in one decoder layer, without gradient checkpointing."""
    d = stats.text
    h, kv, i = d.hidden, d.kv_heads * d.head_dim, d.intermediate
    per = (8 + 2 * w) * h + w * (h + kv) + 2 * w * h + w * h + 4 * w * i
    if lora_dropout:
        per += (w + 1) * (6 * h + i)
    return float(per)


def micro_batch_prompts(config: Config, shape: Shapes) -> int:
    """Prompts in one (the largest) micro-batch: ``train.micro_batch_prompts``, or as many rows at the budget
    maxima as ``train.micro_batch_tokens`` holds (at least one, at most a rank's share)."""
    from vlm_grpoma.trainer.micro_batches import prompts_per_micro_batch

    t, r = config.train, config.rollout
    if not t.micro_batch_tokens:
        return t.micro_batch_prompts
    if t.logprob_pass == "shared":
        row_len, rows = shape.packed_row, 1
    else:
        row_len, rows = shape.naive_row, r.answers_per_prompt()
    return min(prompts_per_micro_batch(t.micro_batch_tokens, row_len, rows), shape.prompts_per_rank)


def mask_bytes(config: Config, rows: int, row_len: int, w: int, block: int | None = None) -> float:
    """The shared pass's attention mask: dense ``[L, L]`` (w-byte additive + bool visibility) per row, or a
    FlexAttention BlockMask of ``block`` (128) columns a block: four int32 ``[L/block, L/block + 1]``
    block-index tables with their counts, and the segment table (17 bytes a column)."""
    if config.model.attn_implementation != "flex_attention":
        return float(rows * (w + 4) * row_len**2)
    from vlm_grpoma.trainer.packed import FLEX_BLOCK

    block = block or FLEX_BLOCK
    blocks = -(-row_len // block)
    return float(rows * (4 * 4 * blocks * (blocks + 1) + 17 * blocks * block))


def training_pass_bytes(
    config: Config, stats: ModelStats, shape: Shapes, w: int, checkpointing: bool
) -> dict[str, float]:
    """Activations, logits and mask of one micro-batch of the configured log-prob pass."""
    d, r, mb = stats.text, config.rollout, micro_batch_prompts(config, shape)
    if config.train.logprob_pass == "shared":
        rows, row_len, scored = mb, shape.packed_row, shape.packed_row - shape.prompt_tokens + 1
    else:
        rows, row_len = mb * r.answers_per_prompt(), shape.naive_row
        scored = r.max_thought_tokens + r.max_answer_tokens + 1
    tokens = rows * row_len
    per_layer = activation_bytes_per_token(
        stats, w, config.model.lora.enabled and config.model.lora.dropout > 0
    )
    kept_layers = (
        tokens * w * d.hidden * d.layers + tokens * per_layer
        if checkpointing
        else tokens * per_layer * d.layers
    )
    parts = {
        "decoder activations": float(kept_layers),
        "logits": float(rows * scored * d.vocab * ((w + 8) if w < 4 else 8)),
    }
    if config.train.logprob_pass == "shared":
        parts["attention mask"] = mask_bytes(config, rows, row_len, w)
    if stats.trainable_vision:
        v, family = stats.vision_dims, stats.family
        patches = shape.image_tokens * (family.factor // family.patch_size) ** 2
        images = mb if config.train.logprob_pass == "shared" else rows
        kept = 1 if checkpointing else v.depth
        parts["vision activations"] = float(images * patches * w * (6 * v.hidden + 3 * v.intermediate) * kept)
    return parts


def rollout_bytes(config: Config, stats: ModelStats, shape: Shapes, hw: Hardware, w: int) -> dict[str, float]:
    """Between training passes: the transformers rollout's KV cache and logits, and under ZeRO-3 the full
    weights gathered for sampling or for the vLLM weight sync."""
    d, r = stats.text, config.rollout
    parts = {}
    if r.backend == "hf":
        rows = shape.prompts_per_rank * r.answers_per_prompt()
        parts["rollout KV cache"] = float(rows * shape.naive_row * 2 * d.layers * d.kv_heads * d.head_dim * w)
        parts["rollout logits"] = float(rows * d.vocab * 4 * 2)
    if config.deepspeed.zero_stage == 3:
        parts["gathered weights (ZeRO-3)"] = float(w * stats.total * (1 - 1 / hw.world_size))
    return parts


def estimate(config: Config, stats: ModelStats, hw: Hardware) -> MemoryPlan:
    """Per-GPU peak bytes of ``config`` on ``hw`` (see the module docstring for every formula)."""
    if config.train.prompts_per_step % hw.world_size:
        raise ConfigError(
            f"train.prompts_per_step: {config.train.prompts_per_step} prompts do not divide across "
            f"{hw.world_size} GPUs"
        )
    precision = precision_of(config, hw.device)
    w = 4 if precision == "fp32" else 2
    shape = shapes(config, stats, hw.world_size)
    states, cpu, source = model_state_bytes(config, stats, hw, w)
    with_gc = training_pass_bytes(config, stats, shape, w, checkpointing=True)
    without_gc = training_pass_bytes(config, stats, shape, w, checkpointing=False)
    vllm = config.rollout.backend == "vllm"
    rollout = rollout_bytes(config, stats, shape, hw, w)
    training_pass = with_gc if config.model.gradient_checkpointing else without_gc
    dynamic = max(sum(training_pass.values()), sum(rollout.values()))
    reserve = CUDA_RESERVE_BYTES + FRAGMENTATION * dynamic if hw.device == "gpu" else 0.0
    capacity = hw.gpu_mem_gb * GIB
    notes = [f"trainable states: {source}"]
    vllm_share = 0.0
    if vllm:
        vllm_share = config.rollout.vllm.gpu_memory_utilization * capacity
        weights = 2 * stats.base_parameters / config.rollout.vllm.tensor_parallel_size
        if weights > vllm_share:
            notes.append(
                f"rollout.vllm.gpu_memory_utilization: its {vllm_share / GIB:.1f} GB cannot hold vLLM's "
                f"{weights / GIB:.1f} GB weight copy"
            )
    return MemoryPlan(
        precision=precision,
        states=states,
        training_pass=training_pass,
        rollout=rollout,
        reserve=reserve,
        train_peak_without_checkpointing=sum(without_gc.values()),
        train_peak_with_checkpointing=sum(with_gc.values()),
        capacity=capacity,
        vllm_share=vllm_share,
        shapes=shape,
        cpu_offload_bytes=cpu,
        notes=notes,
    )


#: Config changes tried, in this order, when a plan does not fit (``half`` halves the current value); the
#: first that makes it fit is suggested.
KNOBS: tuple[tuple[str, str], ...] = (
    ("model.gradient_checkpointing", "true"),
    ("train.micro_batch_prompts", "1"),
    ("deepspeed.zero_stage", "3"),
    ("deepspeed.offload_optimizer", "true"),
    ("rollout.vllm.gpu_memory_utilization", "half"),
    ("model.max_pixels", "half"),
    ("train.prompts_per_step", "half"),
    ("model.lora.enabled", "true"),
)


@dataclass(frozen=True)
class Knob:
    """A config override and the plan it gives."""

    override: str
    plan: MemoryPlan


def _current(config: Config, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def first_knob(config: Config, stats_for: Any, hw: Hardware) -> Knob | None:
    """The first of :data:`KNOBS` whose override makes the plan fit, else the one leaving the smallest
    shortfall; None when no knob applies. ``stats_for(config)`` counts a changed config's parameters."""
    from vlm_grpoma.config import config_from_dict, validate

    tried = []
    for key, value in KNOBS:
        current = _current(config, key)
        if value == "half":
            value = str(current // 2) if isinstance(current, int) else f"{current / 2:g}"
        if str(current).lower() == value or (
            key == "rollout.vllm.gpu_memory_utilization" and config.rollout.backend != "vllm"
        ):
            continue
        try:
            changed = config_from_dict(config.to_dict(), [f"{key}={value}"])
            validate(changed, hw.world_size)
        except ConfigError:  # e.g. half the prompts no longer divide over the ranks
            continue
        if changed.deepspeed.offload_optimizer and changed.deepspeed.zero_stage == 0:
            continue
        knob = Knob(f"{key}={value}", estimate(changed, stats_for(changed), hw))
        if knob.plan.fits:
            return knob
        tried.append(knob)
    return max(tried, key=lambda k: k.plan.margin) if tried else None
