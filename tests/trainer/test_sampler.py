"""Prompt order: every epoch is a permutation, seeded, sharded without overlap, and resumable exactly."""

import pytest

from vlm_grpoma.trainer.sampler import PromptSampler


def test_each_epoch_visits_every_record_once_and_epochs_differ():
    sampler = PromptSampler(num_records=10, prompts_per_step=5, seed=1)
    first = sampler.next_step() + sampler.next_step()
    second = sampler.next_step() + sampler.next_step()
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert first != second and sampler.epoch == 2


def test_steps_cross_epoch_boundaries():
    sampler = PromptSampler(num_records=5, prompts_per_step=3, seed=0, shuffle=False)
    assert [sampler.next_step() for _ in range(3)] == [[0, 1, 2], [3, 4, 0], [1, 2, 3]]


def test_same_seed_same_order_other_seed_differs():
    a, b, c = (PromptSampler(20, 4, seed=s) for s in (7, 7, 8))
    run_a = [a.next_step() for _ in range(6)]
    assert run_a == [b.next_step() for _ in range(6)]
    assert run_a != [c.next_step() for _ in range(6)]


def test_resume_continues_exactly():
    full = PromptSampler(13, 4, seed=3)
    expected = [full.next_step() for _ in range(8)]
    first = PromptSampler(13, 4, seed=3)
    got = [first.next_step() for _ in range(3)]
    resumed = PromptSampler(13, 4, seed=3)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.next_step() for _ in range(5)]
    assert got == expected


def test_resume_refuses_a_different_dataset():
    state = PromptSampler(13, 4, seed=3).state_dict()
    with pytest.raises(ValueError, match="saw 13 records with seed 3, this run has 12"):
        PromptSampler(12, 4, seed=3).load_state_dict(state)


def test_shards_partition_the_step():
    step = PromptSampler(16, 8, seed=0).next_step()
    shards = [PromptSampler.shard(step, r, 4) for r in range(4)]
    assert sum(shards, []) == step and all(len(s) == 2 for s in shards)
