"""What one request may ask of a rollout server, checked before the engine sees it: body sizes by endpoint,
how long it may wait for a push, and how much sampling it may ask for (prompts, K x M answers, token budgets,
prompt lengths within the engine's context, image sizes within the pixel bounds). A request beyond them is a
:class:`~vlm_grpoma.rollout.server.wire.WireError` naming the field, answered 400 or 413.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vlm_grpoma.config import MAX_ANSWERS_PER_PROMPT
from vlm_grpoma.rollout.server.wire import ServedPrompt, WireError
from vlm_grpoma.sampling import SamplingParams


@dataclass(frozen=True)
class ServerLimits:
    """The bounds of one request (module docstring); 0 leaves a bound unchecked."""

    weights_bytes: int = 64 << 20  # a /weights body: the model's parameters at 4 bytes each, and a margin
    request_bytes: int = 256 << 20  # a /sample or /sample_answers body (prompts with their pixels)
    max_wait_s: float = 3600.0
    max_prompts: int = 1024
    max_answers_per_prompt: int = MAX_ANSWERS_PER_PROMPT
    context_tokens: int = 0  # the engine's context: prompt + thought + answer (0: unchecked)
    max_pixels: int = 0  # the server's model.max_pixels: a resized image is never larger (0: unchecked)
    max_images: int = 0  # the server's model.max_images: images of one prompt (0: unchecked)
    max_video_frames: int = 0  # the server's model.max_video_frames: frames of one video (0: no videos)

    def body_bytes(self, path: str) -> int:
        return self.weights_bytes if path == "/weights" else self.request_bytes

    @classmethod
    def for_model(
        cls,
        parameters: int,
        context_tokens: int,
        max_pixels: int,
        max_images: int = 0,
        max_video_frames: int = 0,
    ) -> ServerLimits:
        """Limits of a server whose model holds ``parameters`` (pushed in float32 at most, plus 10 % and 64 MiB
        for names and framing) with this context, pixel bound and images per prompt."""
        return cls(
            weights_bytes=int(parameters * 4 * 1.1) + (64 << 20),
            context_tokens=context_tokens,
            max_pixels=max_pixels,
            max_images=max_images,
            max_video_frames=max_video_frames,
        )

    def check_sampling(
        self, prompts: Sequence[ServedPrompt], params: SamplingParams, what: str, answers: int | None = None
    ) -> None:
        """Refuse a request for more than the server gives: ``answers`` per prompt (K x M by default)."""
        if not prompts or len(prompts) > self.max_prompts:
            raise WireError(f"{what}: {len(prompts)} prompts; send 1 to {self.max_prompts} per request")
        answers = params.num_thoughts * params.answers_per_thought if answers is None else answers
        if answers > self.max_answers_per_prompt:
            raise WireError(
                f"{what}: {answers} answers per prompt; this server samples at most {self.max_answers_per_prompt}"
            )
        budget = params.max_thought_tokens + params.max_answer_tokens
        for i, prompt in enumerate(prompts):
            if self.context_tokens and len(prompt.input_ids) + budget > self.context_tokens:
                raise WireError(
                    f"{what}: prompts[{i}]: {len(prompt.input_ids)} prompt tokens + {budget} to sample exceed "
                    f"the engine's context of {self.context_tokens}"
                )
            if self.max_images and len(prompt.images) > self.max_images:
                raise WireError(
                    f"{what}: prompts[{i}]: {len(prompt.images)} images; this server's model.max_images is "
                    f"{self.max_images}"
                )
            # qwen-vl-utils repeats the last of an odd number of frames: the bound rounded up to even
            frame_cap = self.max_video_frames + self.max_video_frames % 2
            if prompt.video is not None and len(prompt.video.frames) > frame_cap:
                raise WireError(
                    f"{what}: prompts[{i}]: a video of {len(prompt.video.frames)} frames; this server's "
                    f"model.max_video_frames is {self.max_video_frames}"
                )
            sizes = [image.size for image in prompt.images]
            if prompt.video is not None:
                sizes.append((prompt.video.frames.shape[-1], prompt.video.frames.shape[-2]))
            for width, height in sizes if self.max_pixels else ():
                if width * height > self.max_pixels:
                    raise WireError(
                        f"{what}: prompts[{i}]: a {width}x{height} image; this server's model.max_pixels is "
                        f"{self.max_pixels} (resize as the trainer does)"
                    )

    def check_counts(self, counts: torch.Tensor, what: str) -> int:
        """The most answers a prompt asks for with ``counts [B, K]``: integers in [0, the per-prompt cap]."""
        if counts.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise WireError(f"{what}: counts must be an integer tensor, got {counts.dtype}")
        if counts.numel() and (int(counts.min()) < 0 or int(counts.max()) > self.max_answers_per_prompt):
            raise WireError(f"{what}: counts must lie in [0, {self.max_answers_per_prompt}]")
        return int(counts.sum(-1).max()) if counts.numel() else 0
