"""The ``LLM.generate`` requests of one rollout: phase 1 (K thoughts per prompt), the scoring requests that
close truncated thoughts, and phase 2 (M answers per thought), built from prompts and sampling parameters.

vLLM expands each ``<|image_pad|>`` of a token prompt into its image's tokens itself, so a request carries the
prompt with every run of image placeholders collapsed to one, plus the resized PIL images in prompt order and
the adapter's pixel bounds. A prompt with a video carries the prompt before expansion (``placeholder_ids``) and
the frames the trainer saw, ``uint8 [T, H, W, 3]`` with their metadata, neither resized nor resampled again. Log-probs are requested for the sampled token only (``logprobs=0``); vision tokens (and, in
thoughts, end of turn) are banned through ``bad_words``, each banned string encoding to its one special-token id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vlm_grpoma.models.base import PromptInputs, SpecialTokens
from vlm_grpoma.models.prompts import ANSWER_CLOSE, THINK_CLOSE
from vlm_grpoma.rollout.vllm.options import pixel_bounds
from vlm_grpoma.sampling import SamplingParams

if TYPE_CHECKING:
    from PIL import Image
    from transformers import PreTrainedTokenizerBase

    from vlm_grpoma.models.qwen import QwenVLAdapter


@dataclass(frozen=True)
class Request:
    """One ``LLM.generate`` request: a ``TokensPrompt`` and the ``vllm.SamplingParams`` keyword arguments."""

    prompt_token_ids: list[int]
    images: tuple[Image.Image, ...]  # (): a text-only prompt, sent without multi-modal data
    mm_processor_kwargs: dict[str, Any]
    sampling: dict[str, Any]
    video: tuple[np.ndarray, dict[str, Any]] | None = None  # frames [T, H, W, 3] and their metadata

    def prompt(self) -> dict[str, Any]:
        """The ``vllm.inputs.TokensPrompt`` (a TypedDict, so a plain dict)."""
        if not self.images and self.video is None:
            return {"prompt_token_ids": list(self.prompt_token_ids)}
        data: dict[str, Any] = {}
        if self.images:
            data["image"] = self.images[0] if len(self.images) == 1 else list(self.images)
        kwargs = dict(self.mm_processor_kwargs)
        if self.video is not None:  # the trainer's frames exactly: no resampling, no second resize
            data["video"] = self.video
            kwargs |= {"do_sample_frames": False, "do_resize": False}
        return {
            "prompt_token_ids": list(self.prompt_token_ids),
            "multi_modal_data": data,
            "mm_processor_kwargs": kwargs,
        }


def collapse_image_placeholders(ids: Sequence[int], image_id: int) -> list[int]:
    """``ids`` with every run of ``image_id`` reduced to one token: the unexpanded prompt vLLM expects."""
    out: list[int] = []
    for token in ids:
        if not (token == image_id and out and out[-1] == image_id):
            out.append(int(token))
    return out


def video_request(prompt: PromptInputs) -> tuple[np.ndarray, dict[str, Any]] | None:
    """The prompt's video as vLLM takes it: uint8 frames ``[T, H, W, 3]`` and the metadata the trainer used."""
    if prompt.video is None:
        return None
    frames = prompt.video.frames.permute(0, 2, 3, 1).contiguous().numpy()
    return frames, dict(prompt.video.metadata)


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


def banned_words(tokenizer: PreTrainedTokenizerBase, ids: Iterable[int]) -> list[str]:
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
    def for_adapter(cls, adapter: QwenVLAdapter, reuse_prefix_cache: bool = True) -> RequestBuilder:
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
        if prompt.placeholder_ids is not None:
            ids = prompt.placeholder_ids.tolist()
        else:
            ids = collapse_image_placeholders(prompt.input_ids.tolist(), self.tokens.image_id)
        bounds = pixel_bounds(self.min_pixels, self.max_pixels)
        return Request(
            ids + list(continuation), tuple(prompt.images), bounds, sampling, video_request(prompt)
        )

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
        counts: Sequence[int] | None = None,
    ) -> list[Request]:
        """Phase 2: one request per (prompt, thought) in order b, k, with ``n=M``; ends at ``</answer>``,
        end of turn, or the answer budget. ``counts`` (adaptive answers: one per thought) replaces M, and a
        thought with count 0 gets no request."""
        k = params.num_thoughts
        counts = [params.answers_per_thought] * len(thoughts) if counts is None else counts
        stop = (
            {"stop": [], "ignore_eos": True}
            if params.ignore_stop
            else {"stop": [ANSWER_CLOSE], "stop_token_ids": list(self.tokens.eos_ids)}
        )
        return [
            self._request(
                prompts[i // k],
                thought,
                n=counts[i],
                max_tokens=params.max_answer_tokens,
                seed=request_seed(seeds[i // k], 2, i // k, i % k),
                include_stop_str_in_output=True,
                bad_words=list(self.vision_words),
                skip_reading_prefix_cache=not self.reuse_prefix_cache,
                **stop,
                **self._filters(params.phase2_temperature, params),
            )
            for i, thought in enumerate(thoughts)
            if counts[i] > 0
        ]
