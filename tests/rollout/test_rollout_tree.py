"""RolloutTree helpers on a hand-built tree, and the transformers backend's logit filters."""

from __future__ import annotations

import pytest
import torch
from tree_segments import answer_segments, thought_segments  # tests/rollout/tree_segments.py

from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.sampling import SamplingParams

PAD = 0


def _prompt(ids: list[int]) -> PromptInputs:
    return PromptInputs(
        record=None,
        text="",
        images=(),
        input_ids=torch.tensor(ids),
        pixel_values=torch.zeros(1, 1),
        image_grid_thw=torch.ones(1, 3, dtype=torch.long),
        frame=None,
    )


def _pad(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    return ids, torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])


@pytest.fixture
def tree() -> RolloutTree:
    """B=2, K=2, M=2 with thoughts/answers of known tokens (thought ids 1x, answer ids 1xx)."""
    thoughts = [[11, 12, 99], [13, 99], [14, 99], [15, 16, 17, 99]]
    answers = [[101], [102, 103], [104, 105, 106], [107], [108], [109, 110], [111], [112]]
    t_ids, t_mask = _pad(thoughts, 4)
    a_ids, a_mask = _pad(answers, 3)
    return RolloutTree(
        prompts=[_prompt([1, 2, 3]), _prompt([4, 5])],
        pad_id=PAD,
        thought_ids=t_ids.view(2, 2, 4),
        thought_mask=t_mask.view(2, 2, 4),
        thought_logprobs=-t_ids.float().view(2, 2, 4) * t_mask.view(2, 2, 4),
        thought_finish=[["stop", "stop"], ["stop", "length"]],
        thought_texts=[["t0", "t1"], ["t2", "t3"]],
        answer_ids=a_ids.view(2, 2, 2, 3),
        answer_mask=a_mask.view(2, 2, 2, 3),
        answer_logprobs=-a_ids.float().view(2, 2, 2, 3) * a_mask.view(2, 2, 2, 3),
        answer_finish=[[["stop", "stop"], ["length", "stop"]], [["stop", "stop"], ["stop", "stop"]]],
        answer_texts=[[["a0", "a1"], ["a2", "a3"]], [["a4", "a5"], ["a6", "a7"]]],
    )


def test_shape_flags_and_lengths(tree):
    assert tree.shape == (2, 2, 2)
    assert tree.thought_truncated.tolist() == [[False, False], [False, True]]
    assert tree.answer_truncated[0, 1].tolist() == [True, False] and tree.answer_truncated.sum() == 1
    assert tree.thought_lengths.tolist() == [[3, 2], [2, 4]]
    assert tree.answer_lengths[0, 1].tolist() == [3, 1]


def test_segments_pair_tokens_with_their_context(tree):
    thoughts = list(thought_segments(tree))
    assert [(s.prompt_index, s.thought_index, s.answer_index) for s in thoughts] == [
        (0, 0, None),
        (0, 1, None),
        (1, 0, None),
        (1, 1, None),
    ]
    assert thoughts[3].context.tolist() == [4, 5] and thoughts[3].tokens.tolist() == [15, 16, 17, 99]
    assert torch.equal(thoughts[3].logprobs, -thoughts[3].tokens.float())
    answers = list(answer_segments(tree))
    assert len(answers) == 8
    seg = answers[2]  # b=0, k=1, m=0
    assert (seg.prompt_index, seg.thought_index, seg.answer_index) == (0, 1, 0)
    assert seg.context.tolist() == [1, 2, 3, 13, 99] and seg.tokens.tolist() == [104, 105, 106]
    assert torch.equal(seg.logprobs, -seg.tokens.float())


def test_completions_join_thought_and_answer(tree):
    assert tree.completions()[1][0] == ["t2a4", "t2a5"]


def test_filter_logits_matches_a_reference():
    from vlm_grpoma.rollout.hf import filter_logits

    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0]])
    kept = filter_logits(logits, 1.0, SamplingParams(top_k=2)).isfinite()
    assert kept.tolist() == [[True, False, False, False, True]]
    probs = logits.softmax(-1)[0]  # sorted: 3.0 (.55), 2.0 (.20), 1.0 (.07)...
    p = float(probs[4] + probs[0]) - 1e-3  # the two largest reach p: keep exactly those
    kept = filter_logits(logits, 1.0, SamplingParams(top_p=p)).isfinite()
    assert kept.tolist() == [[True, False, False, False, True]]
    torch.testing.assert_close(filter_logits(logits, 0.5, SamplingParams()), logits / 0.5)


def test_thought_loss_mask_drops_only_the_closing_tokens_of_truncated_thoughts(tree):
    mask = tree.thought_loss_mask(closing_tokens=1)
    # (1, 1) was truncated: its appended closing token (99, the 4th) is context only; the others are untouched
    assert mask[1, 1].tolist() == [True, True, True, False]
    mask[1, 1] = tree.thought_mask[1, 1]
    assert torch.equal(mask, tree.thought_mask)
    assert torch.equal(tree.thought_loss_mask(0), tree.thought_mask)


def test_select_and_concatenate_keep_every_part_aligned(tree):
    picked = tree.select([1])
    assert picked.shape == (1, 2, 2) and picked.thought_texts == [["t2", "t3"]]
    assert torch.equal(picked.answer_ids[0], tree.answer_ids[1]) and picked.prompts[0] is tree.prompts[1]
    narrow = tree.select([0])
    narrow.thought_ids, narrow.thought_mask = narrow.thought_ids[..., :3], narrow.thought_mask[..., :3]
    narrow.thought_logprobs = narrow.thought_logprobs[..., :3]
    narrow.seconds, picked.seconds = {"thoughts": 1.0}, {"thoughts": 2.0, "answers": 1.0}
    joined = RolloutTree.concatenate([picked, narrow])
    assert joined.shape == (2, 2, 2) and joined.thought_ids.shape[-1] == 4  # padded to the widest
    assert joined.thought_finish == [tree.thought_finish[1], tree.thought_finish[0]]
    assert torch.equal(joined.thought_tokens(1, 0), tree.thought_tokens(0, 0))
    assert torch.equal(joined.answer_tokens(0, 1, 0), tree.answer_tokens(1, 1, 0))
    assert joined.thought_ids[1, 0, 3] == PAD and not joined.thought_mask[1, 0, 3]
    assert joined.seconds == {"thoughts": 3.0, "answers": 1.0}


def test_tempered_log_prob_temperature_follows_the_phase():
    params = SamplingParams(temperature=0.7, answer_temperature=0.0, tempered_logprobs=True)
    assert params.logprob_temperature(params.temperature) == 0.7
    # greedy has no distribution of its own
    assert params.logprob_temperature(params.phase2_temperature) == 1.0
    assert SamplingParams(temperature=0.7).logprob_temperature(0.7) == 1.0  # raw log-probs


def test_with_answers_puts_present_answers_first_and_carries_the_mask(tree):
    """Extra answers (2, 0, 1, 3 after the four thoughts) join each thought's answers, in slot order after its
    own; select and concatenate keep the mask; extra answers after other thoughts are refused."""
    from vlm_grpoma.rollout.tree import answers_at

    slots = [(0, 0), (0, 1), (2, 0), (3, 0), (3, 1), (3, 2)]
    ids = torch.tensor(
        [[201, 202, 0, 0], [203, 0, 0, 0], [204, 0, 0, 0], [205, 0, 0, 0], [206, 0, 0, 0], [207, 0, 0, 0]]
    )
    mask = ids != 0
    extra = answers_at(
        tree,
        slots,
        3,
        ids=ids,
        mask=mask,
        logprobs=-ids.float() * mask,
        finish=["stop"] * 6,
        texts=[f"e{i}" for i in range(6)],
    )
    assert torch.equal(extra.answer_counts, torch.tensor([[2, 0], [1, 3]]))
    merged = tree.with_answers(extra, width=5)
    assert merged.shape == (2, 2, 5)
    assert torch.equal(merged.answer_counts, torch.tensor([[4, 2], [3, 5]]))
    assert torch.equal(merged.present, torch.arange(5) < merged.answer_counts.unsqueeze(-1))
    assert merged.answer_texts[0][0] == ["a0", "a1", "e0", "e1", ""]
    assert merged.answer_texts[1][1] == ["a6", "a7", "e3", "e4", "e5"]
    assert merged.answer_tokens(0, 0, 0).tolist() == [101] and merged.answer_tokens(0, 0, 2).tolist() == [
        201,
        202,
    ]
    assert merged.answer_tokens(0, 1, 2).tolist() == [] and merged.answer_finish[0][1][2] == "stop"
    real = merged.answer_mask
    assert torch.equal(merged.answer_logprobs[real], -merged.answer_ids[real].float())
    both = RolloutTree.concatenate([merged.select([1]), merged.select([0])])
    assert torch.equal(both.answer_counts, torch.tensor([[3, 5], [4, 2]]))
    assert RolloutTree.concatenate([tree, tree]).answer_present is None
    with pytest.raises(ValueError, match="sampled after other thoughts"):
        tree.select([1, 0]).with_answers(extra, width=5)
    with pytest.raises(ValueError, match="more than 4 answers"):
        tree.with_answers(extra, width=4)
