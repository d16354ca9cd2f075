"""The vLLM rollout engine: a colocated ``vllm.LLM`` per rank samples the K x M tree (CUDA or CPU build).

Phase 1 submits each prompt once with ``n=K`` (stop ``</think>`` kept in the output, the thought budget as
``max_tokens``). Thoughts that ran out of budget get ``</think>`` appended and flagged, as in the transformers
backend; the model's log-probs of those forced tokens come from one ``prompt_logprobs`` request per truncated
thought. Phase 2 submits prompt + thought token ids with ``n=M``: with automatic prefix caching the M answers
reuse the KV blocks of image + prompt + thought, so phase 2 costs little more than decoding. More answers after
the same thoughts (``sample_answers``, adaptive answers) are phase-2 requests with a count per thought: their
prefix blocks are still cached from phase 2 (the weights have not changed in between).

Weights follow the policy through vLLM's in-place ``reload_weights`` (checkpoint names, LoRA merged, ZeRO-3
gathered), after which every cache computed with the old weights is dropped: prefix (KV) blocks and encoder
(vision embedding) outputs; on CPU a tied output layer is re-packed (:mod:`.weights`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from vlm_grpoma.errors import ConfigError
from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.models.prompts import ANSWER_CLOSE, THINK_CLOSE
from vlm_grpoma.rollout.base import full_module
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.rollout.vllm.options import VLLMOptions, check_options, context_length, engine_arguments
from vlm_grpoma.rollout.vllm.outputs import (
    Sampled,
    assemble_answers,
    assemble_tree,
    check_expansion,
    close_thought,
    forced_logprobs,
    read_request,
)
from vlm_grpoma.rollout.vllm.requests import Request, RequestBuilder
from vlm_grpoma.rollout.vllm.stack import import_vllm
from vlm_grpoma.rollout.vllm.weights import Counted, merged_weights, repack_tied_output_layers
from vlm_grpoma.sampling import SamplingParams

if TYPE_CHECKING:
    from vlm_grpoma.distributed import DistInfo
    from vlm_grpoma.models.qwen import QwenVLAdapter
    from vlm_grpoma.rollout.base import Policy


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
    adapter: QwenVLAdapter = field(repr=False)
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
        adapter: QwenVLAdapter,
        options: VLLMOptions,
        *,
        seed: int = 0,
        dist: DistInfo | None = None,
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

    def update_weights(self, model: Policy) -> int:
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
        counted = Counted(weights)
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

    def _gather(self, prompts: Sequence[PromptInputs], seed: int, rows: Sequence[Any] | None = None) -> Any:
        """All prompts (and their owners' seeds) of this rank's tensor-parallel group, and this rank's slice;
        with ``rows`` (one per prompt), all of the group's rows too."""
        if self.group.size == 1:
            gathered = list(prompts), [seed] * len(prompts), slice(0, len(prompts))
            return gathered if rows is None else (*gathered, list(rows))
        parts: list[Any] = [None] * self.group.size
        torch.distributed.all_gather_object(
            parts, (list(prompts), seed, None if rows is None else list(rows)), group=self.group.process_group
        )
        start = sum(len(p) for p, _, _ in parts[: self.group.index])
        gathered = (
            [p for ps, _, _ in parts for p in ps],
            [s for ps, s, _ in parts for _ in ps],
            slice(start, start + len(prompts)),
        )
        return gathered if rows is None else (*gathered, [r for _, _, rs in parts for r in rs])

    def _generate(self, requests: Sequence[Request]) -> list[Any]:
        if self.sampling_params_type is None:
            from vllm import SamplingParams as VSamplingParams

            self.sampling_params_type = VSamplingParams
        return self.llm.generate(
            [r.prompt() for r in requests],
            [self.sampling_params_type(**r.sampling) for r in requests],
            use_tqdm=False,
        )

    def sample_answers(self, tree: RolloutTree, counts: torch.Tensor, params: SamplingParams) -> RolloutTree:
        """``counts[b, k]`` more answers after each thought of ``tree`` (phase-2 requests, prefix cached)."""
        self._wake("weights", "kv_cache")
        try:
            return self._sample_answers(tree, counts, params)
        finally:
            self.sleep()

    def _sample_answers(self, tree: RolloutTree, counts: torch.Tensor, params: SamplingParams) -> RolloutTree:
        b_count, k, _ = tree.shape
        tokenizer = self.adapter.tokenizer
        rows = [
            ([tree.thought_tokens(b, j).tolist() for j in range(k)], counts[b].tolist())
            for b in range(b_count)
        ]
        everyone, seeds, mine, rows = self._gather(tree.prompts, params.seed, rows)
        thoughts = [t for thought_row, _ in rows for t in thought_row]
        per_thought = [n for _, count_row in rows for n in count_row]
        builder = RequestBuilder.for_adapter(self.adapter, self.options.reuse_prefix_cache)
        start = time.perf_counter()
        generated = self._generate(
            builder.answers(everyone, seeds, thoughts, replace(params, num_thoughts=k), per_thought)
        )
        self.stats = {
            "answer_prompt_tokens": float(sum(len(o.prompt_token_ids) for o in generated)),
            "answer_cached_tokens": float(sum(o.num_cached_tokens or 0 for o in generated)),
        }
        outputs = iter(generated)
        answers: list[list[Sampled]] = [
            read_request(
                next(outputs),
                n,
                stop=None if params.ignore_stop else ANSWER_CLOSE,
                stop_ids=self.adapter.tokens.eos_ids,
                budget=params.max_answer_tokens,
                decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            )
            if n
            else []
            for n in per_thought
        ]
        extra = assemble_answers(
            tree,
            answers[mine.start * k : mine.stop * k],
            answer_width=params.max_answer_tokens,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        )
        extra.seconds = {"answers": time.perf_counter() - start}
        return extra

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
