"""benchmarks/variance.py: the conditional (paper) variance against the thought-resampled one and the large-K
limit, the plug-in's small-K bias, and the allocation comparison's oracle arm on reward models with known σ_k."""

import pytest
import torch
from variance import (
    ALLOCATION_SETTINGS,
    compare_allocation,
    conditional_variance,
    estimate,
    gaussian,
    main,
    thought_resampled_variance,
)


def test_conditional_variance_excludes_thought_resampling_at_small_k():
    gen = torch.Generator().manual_seed(0)
    conditional = estimate(conditional_variance(4, 16, 128, 64, 2.0, 2.0, gen).variance)
    resampled = estimate(thought_resampled_variance(4, 16, 128, 64, 2.0, 2.0, gen)[0])
    gap = resampled.mean - conditional.mean
    assert gap > 4 * (conditional.stderr**2 + resampled.stderr**2) ** 0.5  # 0.35 vs 0.21 (issue #29)


def test_conditional_variance_and_plugin_reach_the_limit_at_large_k_and_the_plugin_is_biased_at_small_k():
    gen = torch.Generator().manual_seed(1)
    large = conditional_variance(64, 4, 64, 64, 2.0, 2.0, gen)
    exact, limit = estimate(large.variance), large.limit.mean().item()
    assert abs(exact.mean - limit) < 4 * exact.stderr + 0.02  # O(1/K) finite-K bias
    assert abs(large.plugin.mean().item() / limit - 1) < 0.06
    small = conditional_variance(4, 16, 128, 64, 2.0, 2.0, gen)
    assert small.plugin.mean() > 1.3 * small.variance.mean()


def test_oracle_allocation_is_uniform_for_equal_spreads_and_gains_when_they_differ():
    settings = dict(thoughts=4, budget=16, first=2, max_per_thought=10, sets=64, replicates=64)
    equal = compare_allocation(gaussian(0.5, 0.5), gen=torch.Generator().manual_seed(2), **settings)
    assert equal.oracle_value_variance.value == 1.0 and equal.oracle_advantage_variance.value == 1.0
    spread = compare_allocation(gaussian(0.1, 1.0), gen=torch.Generator().manual_seed(2), **settings)
    # oracle Neyman: Σσ²/M_k at M_k ∝ σ_k is (Σσ_k)²/B against K·Σσ_k²/B, ≈ 0.80 for log-uniform [0.1, 1]
    assert spread.oracle_value_variance.high < 0.9
    # 8 extra answers, one each at least: σ̂ shrunk from 2 first answers differ by √3 at most, never enough
    # to move an answer, so the adaptive arm is the uniform one (and its two-phase values the plain mean)
    assert spread.fewest == spread.most == 4.0 and spread.value_variance.value == pytest.approx(
        1.0, abs=1e-12
    )


def test_adaptive_allocation_gains_with_room_to_move_answers():
    """4 first answers of 32 (16 extra to place): on spreads that differ, the adaptive arm's unbiased values
    beat the uniform split; on equal spreads they cost a little (the allocation chases noise)."""
    settings = dict(thoughts=4, budget=32, first=4, max_per_thought=20, sets=128, replicates=64)
    spread = compare_allocation(gaussian(0.1, 1.0), gen=torch.Generator().manual_seed(3), **settings)
    assert spread.value_variance.high < 1.0 and spread.fewest < spread.most
    equal = compare_allocation(gaussian(0.5, 0.5), gen=torch.Generator().manual_seed(3), **settings)
    assert 1.0 < equal.value_variance.value < 1.05


def test_quick_run_prints_every_section(capsys):
    main(["--quick", "--sets", "32", "--replicates", "32"])
    out = capsys.readouterr().out
    for heading in ("(1a) CONDITIONAL", "(1b) THOUGHT-RESAMPLED", "(2) Logged plug-in", "(3) Adaptive"):
        assert heading in out
    assert out.count("Normal(μ_k, σ_k²), σ_k = 0.5 (all equal)") == len(ALLOCATION_SETTINGS)
