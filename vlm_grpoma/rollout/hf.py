"""Transformers rollout backend: a batched sampling loop over model forwards with a shared KV cache.

The prompt batch is prefilled once (left padded) and its cache expanded K times for phase 1; the K thoughts
are decoded together. A thought ends when its text gains ``</think>``; one that ran out of budget gets the
closing tokens appended and fed (``SpecialTokens.think_close``: ``</think>``, after a newline when the
prompt opened the thought), so the cache then holds prompt + thought for every (b, k); phase 2 expands that
cache M times and decodes all B·K·M answers together, never recomputing the shared prefix
(``reuse_prefix_cache=False`` recomputes it, as a reference). More answers after the thoughts of a tree
(:meth:`HFRolloutEngine.sample_answers`, adaptive answers) prefill each prompt once, feed each thought once
after it, and expand that cache to the thought's n_k answers (the phase-1 cache is not kept across the
scoring in between). Positions are Qwen-VL's 3-axis mRoPE ids, computed by the model's own ``get_rope_index``
for the prompt and continued as ``last + 1`` on all three axes for generated text, which is what
transformers does during cached generation; finished rows keep stepping with their new columns masked out.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vlm_grpoma.models.base import (
    PromptInputs,
    SpecialTokens,
    collate,
    rope_index_owner,
    rope_positions,
    vision_inputs,
)
from vlm_grpoma.models.prompts import ANSWER_CLOSE, THINK_CLOSE
from vlm_grpoma.rollout.tree import FinishReason, RolloutTree, answers_at
from vlm_grpoma.sampling import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from vlm_grpoma.models.qwen import QwenVLAdapter
    from vlm_grpoma.rollout.base import Policy


@dataclass
class _Stream:
    """Rows being decoded: their KV cache, attention mask [R, L], next text position [R], next-token logits [R, V]."""

    cache: Any
    attention: torch.Tensor
    next_pos: torch.Tensor
    logits: torch.Tensor

    def repeat(self, n: int) -> None:
        """Each row becomes ``n`` adjacent copies (shares the prefix; no recomputation)."""
        if n > 1:
            self.cache.batch_repeat_interleave(n)
            self.attention = self.attention.repeat_interleave(n, 0)
            self.next_pos = self.next_pos.repeat_interleave(n, 0)
            self.logits = self.logits.repeat_interleave(n, 0)

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` in that order, a row repeated as often as it is named (shares the prefix)."""
        self.cache.batch_select_indices(rows)
        self.attention = self.attention[rows]
        self.next_pos = self.next_pos[rows]
        self.logits = self.logits[rows]


@dataclass
class _Decoded:
    """Tokens decoded for R rows: ids/mask/logprobs [R, T]; ``unfed`` rows still have their last token to feed."""

    ids: torch.Tensor
    mask: torch.Tensor
    logprobs: torch.Tensor
    finish: list[FinishReason]
    unfed: torch.Tensor


def cache_argument(module: torch.nn.Module) -> str:
    """The KV-cache keyword of this transformers version's forward: ``cache`` (>= 5.21) or ``past_key_values``
    (earlier, e.g. the 5.20 that vLLM 0.33 pins); the model output carries the cache under the same name."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def filter_logits(logits: torch.Tensor, temperature: float, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p (nucleus) warping of [R, V] logits; removed tokens get -inf."""
    logits = logits / temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # keeps the smallest prefix reaching top_p (>= 1 token)
        drop = probs.cumsum(-1) - probs > params.top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


class HFRolloutEngine:
    """Two-phase K x M sampling with a transformers Qwen-VL model (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokens: SpecialTokens,
        tokenizer: PreTrainedTokenizerBase,
        reuse_prefix_cache: bool = True,
    ) -> None:
        self.model = model
        self.tokens = tokens
        self.tokenizer = tokenizer
        self.reuse_prefix_cache = reuse_prefix_cache
        self._rope = rope_index_owner(model)
        self._cache_arg = cache_argument(self._rope)
        self._stop_tables: dict[tuple[str, int], torch.Tensor] = {}

    @classmethod
    def for_adapter(
        cls, model: torch.nn.Module, adapter: QwenVLAdapter, reuse_prefix_cache: bool = True
    ) -> HFRolloutEngine:
        return cls(model, adapter.tokens, adapter.tokenizer, reuse_prefix_cache)

    # -- model calls ---------------------------------------------------------------------------------------

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _prefill(
        self, prompts: Sequence[PromptInputs], rows: Sequence[Sequence[int]], prompt_of_row: Sequence[int]
    ) -> _Stream:
        from transformers import DynamicCache

        dev = self._device()
        batch = {k: v.to(dev) for k, v in collate(prompts, rows, prompt_of_row, self.tokens).items()}
        positions = rope_positions(self._rope, batch)
        cache = DynamicCache(config=self.model.config)
        batch |= vision_inputs(batch, dev, self.model.dtype)  # absent for text-only prompts
        out = self.model(
            **batch, position_ids=positions, **{self._cache_arg: cache}, use_cache=True, logits_to_keep=1
        )
        return _Stream(
            getattr(out, self._cache_arg),
            batch["attention_mask"],
            positions.amax(dim=(0, 2)) + 1,
            out.logits[:, -1].float(),
        )

    def _feed(self, stream: _Stream, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Feed ids [R, W] (mask [R, W]: 1 = real token) and return logits [R, W, V]; updates the stream."""
        r, w = ids.shape
        offsets = mask.long().cumsum(1) - mask.long()
        positions = (stream.next_pos[:, None] + offsets).unsqueeze(0).expand(3, r, w)
        stream.attention = torch.cat([stream.attention, mask.long()], 1)
        out = self.model(
            input_ids=ids,
            attention_mask=stream.attention,
            position_ids=positions,
            **{self._cache_arg: stream.cache},
            use_cache=True,
        )
        n = mask.long().sum(1)
        stream.next_pos = stream.next_pos + n
        logits = out.logits.float()
        last = (n - 1).clamp(min=0)
        fed = n > 0
        stream.logits = torch.where(fed[:, None], logits[torch.arange(r), last], stream.logits)
        return logits

    # -- sampling ------------------------------------------------------------------------------------------

    def _choose(
        self,
        logits: torch.Tensor,
        suppress: torch.Tensor,
        temperature: float,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> torch.Tensor:
        logits = logits.masked_fill(suppress, float("-inf"))
        if temperature == 0:
            return logits.argmax(-1)
        probs = filter_logits(logits, temperature, params).softmax(-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    def _stop_table(self, text: str, vocab: int) -> torch.Tensor:
        """[V] bool: tokens whose text holds the last character of ``text`` (only they can complete it).

        A printable ASCII character is spelled as itself in byte-level and sentencepiece token strings, so
        the raw token strings suffice (fast); other characters need each token decoded.
        """
        key = (text, vocab)
        if key not in self._stop_tables:
            n = min(vocab, len(self.tokenizer))
            if 33 <= ord(text[-1]) <= 126:
                pieces = self.tokenizer.convert_ids_to_tokens(list(range(n)))
            else:
                pieces = self.tokenizer.batch_decode([[i] for i in range(n)])
            table = torch.zeros(vocab, dtype=torch.bool)
            table[:n] = torch.tensor([p is not None and text[-1] in p for p in pieces])
            self._stop_tables[key] = table
        return self._stop_tables[key]

    def _decode(
        self,
        stream: _Stream,
        budget: int,
        stop: str,
        stop_ids: Sequence[int],
        suppress: torch.Tensor,
        temperature: float,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> _Decoded:
        """Sample up to ``budget`` tokens per row, ending a row when its text gains ``stop`` or at ``stop_ids``.

        The stop string is matched in the decoded text, so it is found whatever tokens spell it (the real
        Qwen2 vocabulary writes ``</think><answer>`` as ``</ think ><``).
        """
        r, dev = stream.logits.shape[0], stream.logits.device
        ids = torch.full((r, budget), self.tokens.pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros((r, budget), dtype=torch.bool, device=dev)
        logprobs = torch.zeros((r, budget), device=dev)
        done = torch.zeros(r, dtype=torch.bool, device=dev)
        stopped = torch.zeros(r, dtype=torch.bool, device=dev)
        table = self._stop_table(stop, suppress.shape[0]).to(dev)
        id_stops = torch.zeros_like(table)
        id_stops[list(stop_ids)] = True
        window = len(stop) + 2
        rows = torch.arange(r, device=dev)
        scale = params.logprob_temperature(temperature)
        for t in range(budget):
            alive = ~done
            token = torch.where(
                alive,
                self._choose(stream.logits, suppress, temperature, params, generator),
                self.tokens.pad_id,
            )
            ids[:, t], mask[:, t] = token, alive
            logprobs[:, t] = torch.where(alive, (stream.logits / scale).log_softmax(-1)[rows, token], 0.0)
            if not params.ignore_stop:
                stopped |= alive & id_stops[token]
                for i in (alive & table[token] & ~stopped).nonzero().flatten().tolist():
                    stopped[i] = stop in self.tokenizer.decode(
                        ids[i, max(0, t + 1 - window) : t + 1].tolist()
                    )
            done = done | stopped
            if bool(done.all()) or t == budget - 1:
                unfed = alive
                break
            self._feed(stream, token[:, None], alive[:, None])
        finish: list[FinishReason] = ["stop" if s else "length" for s in stopped.tolist()]
        return _Decoded(ids, mask, logprobs, finish, unfed)

    def _close_thoughts(self, stream: _Stream, thoughts: _Decoded, scale: float) -> _Decoded:
        """Append ``</think>`` to truncated thoughts and feed every row's unfed tail, so the cache is prompt+thought
        (the closing tokens' log-probs under ``logits / scale``, as the thought's)."""
        close = list(self.tokens.think_close)
        r = thoughts.ids.shape[0]
        lengths = thoughts.mask.sum(1)
        tails = []
        for i in range(r):
            tail = [int(thoughts.ids[i, lengths[i] - 1])] if thoughts.unfed[i] else []
            tails.append(tail + (close if thoughts.finish[i] == "length" else []))
        width = max(len(tail) for tail in tails)  # >= 1: the rows alive at the last step are unfed
        ids = torch.cat(
            [thoughts.ids, torch.full((r, len(close)), self.tokens.pad_id, device=thoughts.ids.device)], 1
        )
        mask = torch.cat(
            [thoughts.mask, torch.zeros((r, len(close)), dtype=torch.bool, device=ids.device)], 1
        )
        logprobs = torch.cat([thoughts.logprobs, torch.zeros((r, len(close)), device=ids.device)], 1)
        block = torch.full((r, width), self.tokens.pad_id, dtype=torch.long, device=ids.device)
        block_mask = torch.zeros((r, width), dtype=torch.bool, device=ids.device)
        for i, tail in enumerate(tails):
            block[i, : len(tail)] = torch.tensor(tail, dtype=torch.long)
            block_mask[i, : len(tail)] = True
        block_logp = (self._feed(stream, block, block_mask) / scale).log_softmax(-1)
        for i in range(r):
            if thoughts.finish[i] == "length":
                start, first = int(lengths[i]), len(tails[i]) - len(close)
                closing = torch.tensor(close, device=ids.device)
                ids[i, start : start + len(close)] = closing
                mask[i, start : start + len(close)] = True
                logprobs[i, start : start + len(close)] = (
                    block_logp[i, first - 1 : first - 1 + len(close)].gather(-1, closing[:, None]).squeeze(1)
                )
        return _Decoded(ids, mask, logprobs, thoughts.finish, torch.zeros_like(thoughts.unfed))

    def update_weights(self, model: Policy) -> int:
        """Nothing to copy: every rollout reads the live training module."""
        return 0

    def sample(self, prompts: Sequence[PromptInputs], params: SamplingParams) -> RolloutTree:
        """Sample the K x M tree in eval mode (so the KV cache is on even under gradient checkpointing)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self._sample(prompts, params)
        finally:
            self.model.train(was_training)

    def _suppressed(self, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """[V] bool tokens never sampled: (in answers: vision tokens, in thoughts: vision and end of turn)."""
        vocab = self.model.get_output_embeddings().weight.shape[0]
        vision = torch.zeros(vocab, dtype=torch.bool, device=dev)
        vision[list(self.tokens.suppress_ids)] = True
        no_eos = vision.clone()
        no_eos[list(self.tokens.eos_ids)] = True  # a thought ends only with </think> or its budget
        return vision, no_eos

    def _decode_answers(
        self, stream: _Stream, params: SamplingParams, generator: torch.Generator
    ) -> _Decoded:
        vision, _ = self._suppressed(stream.logits.device)
        return self._decode(
            stream,
            params.max_answer_tokens,
            ANSWER_CLOSE,
            self.tokens.eos_ids,
            vision,
            params.phase2_temperature,
            params,
            generator,
        )

    def sample_answers(self, tree: RolloutTree, counts: torch.Tensor, params: SamplingParams) -> RolloutTree:
        """``counts[b, k]`` more answers after each thought of ``tree`` (module docstring), in eval mode."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self._sample_answers(tree, counts, params)
        finally:
            self.model.train(was_training)

    def _sample_answers(self, tree: RolloutTree, counts: torch.Tensor, params: SamplingParams) -> RolloutTree:
        k = tree.shape[1]
        per_thought = counts.flatten().tolist()
        kept = [i for i, n in enumerate(per_thought) if n > 0]
        slots = [(i, j) for i in kept for j in range(per_thought[i])]  # (thought row, answer slot) per answer
        generator = torch.Generator(device=self._device()).manual_seed(params.seed)
        start = time.perf_counter()
        if not slots:
            empty = torch.zeros((0, params.max_answer_tokens))
            answers = _Decoded(empty.long(), empty.bool(), empty, [], empty.bool())
        elif self.reuse_prefix_cache:
            stream = self._thought_prefixes(tree, kept, [per_thought[i] for i in kept])
            answers = self._decode_answers(stream, params, generator)
        else:  # the reference: every answer's prompt + thought prefilled from scratch
            rows = [
                tree.prompts[i // k].input_ids.tolist() + tree.thought_tokens(i // k, i % k).tolist()
                for i, _ in slots
            ]
            stream = self._prefill(tree.prompts, rows, [i // k for i, _ in slots])
            answers = self._decode_answers(stream, params, generator)
        extra = answers_at(
            tree,
            slots,
            max(per_thought, default=0),
            ids=answers.ids.cpu(),
            mask=answers.mask.cpu(),
            logprobs=answers.logprobs.cpu(),
            finish=answers.finish,
            texts=self._texts(answers),
        )
        extra.seconds = {"answers": time.perf_counter() - start}
        return extra

    def _thought_prefixes(self, tree: RolloutTree, thoughts: list[int], counts: list[int]) -> _Stream:
        """The cache of prompt + thought for each of ``thoughts`` (flat b·K + k), repeated ``counts`` times: each
        prompt (and image) prefilled once, each thought fed once after it, as in phase 1."""
        k = tree.shape[1]
        owners = sorted({i // k for i in thoughts})
        stream = self._prefill(tree.prompts, [tree.prompts[b].input_ids.tolist() for b in owners], owners)
        dev = stream.logits.device
        stream.select(torch.tensor([owners.index(i // k) for i in thoughts], device=dev))
        tokens = [tree.thought_tokens(i // k, i % k) for i in thoughts]
        width = max(len(t) for t in tokens)
        ids = torch.full((len(tokens), width), self.tokens.pad_id, dtype=torch.long)
        mask = torch.zeros((len(tokens), width), dtype=torch.bool)
        for row, thought in enumerate(tokens):
            ids[row, : len(thought)], mask[row, : len(thought)] = thought, True
        self._feed(stream, ids.to(dev), mask.to(dev))
        stream.select(torch.repeat_interleave(torch.tensor(counts, device=dev)))
        return stream

    def _sample(self, prompts: Sequence[PromptInputs], params: SamplingParams) -> RolloutTree:
        b, k, m = len(prompts), params.num_thoughts, params.answers_per_thought
        dev = self._device()
        generator = torch.Generator(device=dev).manual_seed(params.seed)
        vision, no_eos = self._suppressed(dev)
        clock = [time.perf_counter()]
        stream = self._prefill(prompts, [p.input_ids.tolist() for p in prompts], range(b))
        stream.repeat(k)
        clock.append(time.perf_counter())
        thoughts = self._decode(
            stream, params.max_thought_tokens, THINK_CLOSE, (), no_eos, params.temperature, params, generator
        )
        thoughts = self._close_thoughts(stream, thoughts, params.logprob_temperature(params.temperature))
        clock.append(time.perf_counter())
        if self.reuse_prefix_cache:
            stream.repeat(m)
        else:
            rows = [
                prompts[i // k].input_ids.tolist() + thoughts.ids[i][thoughts.mask[i]].tolist()
                for i in range(b * k)
                for _ in range(m)
            ]
            stream = self._prefill(prompts, rows, [i // (k * m) for i in range(b * k * m)])
        answers = self._decode_answers(stream, params, generator)
        clock.append(time.perf_counter())
        tree = self._tree(prompts, thoughts, answers, k, m)
        tree.seconds = dict(
            zip(("prefill", "thoughts", "answers"), [t1 - t0 for t0, t1 in zip(clock, clock[1:])])
        )
        return tree

    def _texts(self, decoded: _Decoded) -> list[str]:
        return [
            self.tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True)
            for ids, mask in zip(decoded.ids.cpu(), decoded.mask.cpu())
        ]

    def _tree(
        self, prompts: Sequence[PromptInputs], thoughts: _Decoded, answers: _Decoded, k: int, m: int
    ) -> RolloutTree:
        b = len(prompts)
        t_texts, a_texts = self._texts(thoughts), self._texts(answers)
        return RolloutTree(
            prompts=list(prompts),
            pad_id=self.tokens.pad_id,
            thought_ids=thoughts.ids.view(b, k, -1).cpu(),
            thought_mask=thoughts.mask.view(b, k, -1).cpu(),
            thought_logprobs=thoughts.logprobs.view(b, k, -1).cpu(),
            thought_finish=[thoughts.finish[i * k : (i + 1) * k] for i in range(b)],
            thought_texts=[t_texts[i * k : (i + 1) * k] for i in range(b)],
            answer_ids=answers.ids.view(b, k, m, -1).cpu(),
            answer_mask=answers.mask.view(b, k, m, -1).cpu(),
            answer_logprobs=answers.logprobs.view(b, k, m, -1).cpu(),
            answer_finish=[
                [answers.finish[(i * k + j) * m : (i * k + j + 1) * m] for j in range(k)] for i in range(b)
            ],
            answer_texts=[
                [a_texts[(i * k + j) * m : (i * k + j + 1) * m] for j in range(k)] for i in range(b)
            ],
        )
