"""Reading vLLM's outputs into the :class:`~vlm_grpoma.rollout.tree.RolloutTree`: each sampled token's own
log-prob, the cut after the stop string, the finish reason, closing truncated thoughts, and the padded tree.

Log-probs are vLLM's ``raw_logprobs`` (before temperature, top-k/p and banned tokens) of the sampled token:
the distribution a teacher-forced forward gives, as the tree's contract asks. The expanded prompt vLLM reports
back is checked against ours, so a different image resize fails loudly instead of training on misaligned
image tokens. Plain functions of vLLM-shaped objects, tested without vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.rollout.tree import FinishReason, RolloutTree, answers_at


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
    # "length": the context is full, so a short sequence without a stop is expected
    if len(ids) < budget and stop is not None and completion.finish_reason != "length":
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


def assemble_answers(
    tree: RolloutTree,
    answers: Sequence[Sequence[Sampled]],
    *,
    answer_width: int,
    decode: Callable[[list[int]], str],
) -> RolloutTree:
    """The ragged tree of ``tree``'s thoughts and ``answers[b·K + k]`` (the extra answers of each thought, any
    number), as many slots per thought as the most answers, padded to ``answer_width`` tokens."""
    slots = [(i, j) for i, per_thought in enumerate(answers) for j in range(len(per_thought))]
    flat = [a for per_thought in answers for a in per_thought]
    ids, mask, logprobs = _pad(flat, tree.pad_id, answer_width)
    return answers_at(
        tree,
        slots,
        max((len(per_thought) for per_thought in answers), default=0),
        ids=ids,
        mask=mask,
        logprobs=logprobs,
        finish=[a.finish for a in flat],
        texts=[decode(a.ids) for a in flat],
    )
