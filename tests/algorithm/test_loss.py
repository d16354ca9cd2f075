"""The GRPO-MA objective against a test-local TRL GRPO loss, finite differences and its defining properties."""

import pytest
import torch

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages
from vlm_grpoma.algorithm.loss import LossStats, Segments, grpo_ma_token_weights, k3_kl, policy_loss

EPS_LOW, EPS_HIGH, BETA = 0.2, 0.28, 0.04


def trl_grpo_loss(logp, old_logp, ref_logp, advantages, mask, loss_type, max_completion_length=None):
    """TRL GRPOTrainer's per-token loss and its aggregations, written out independently."""
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - EPS_LOW, 1 + EPS_HIGH)
    per_token = -torch.min(coef_1 * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))
    per_token = per_token + BETA * (torch.exp(ref_logp - logp) - (ref_logp - logp) - 1)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dapo":
        return (per_token * mask).sum() / mask.sum()
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    raise AssertionError(loss_type)


def random_tree(seed, batch, thoughts, answers, max_thought=7, max_answer=4, dtype=torch.float32):
    """Random log-probs for a B x K thought segments and B x K x M answer segments (with padding)."""
    gen = torch.Generator().manual_seed(seed)
    t_len = torch.randint(1, max_thought + 1, (batch, thoughts), generator=gen)
    a_len = torch.randint(1, max_answer + 1, (batch, thoughts, answers), generator=gen)

    def logps(*shape):
        return -torch.rand(*shape, generator=gen, dtype=dtype) * 3

    tree = {
        "t_len": t_len,
        "a_len": a_len,
        "t_logp": logps(batch, thoughts, max_thought),
        "t_old": logps(batch, thoughts, max_thought),
        "t_ref": logps(batch, thoughts, max_thought),
        "a_logp": logps(batch, thoughts, answers, max_answer),
        "a_old": logps(batch, thoughts, answers, max_answer),
        "a_ref": logps(batch, thoughts, answers, max_answer),
        "rewards": torch.rand(batch, thoughts, answers, generator=gen, dtype=dtype),
    }
    # Keep ratios near 1 for half of the tokens so both clipped and unclipped branches are exercised.
    near = torch.rand(tree["t_old"].shape, generator=gen) < 0.5
    tree["t_old"] = torch.where(near, tree["t_logp"] + 0.05, tree["t_old"])
    return tree


def length_mask(lengths, width):
    return torch.arange(width) < lengths.unsqueeze(-1)


def ours(tree, aggregation, t_logp=None, a_logp=None, max_completion=None, thought_loss_weight=1.0):
    t_logp = tree["t_logp"] if t_logp is None else t_logp
    a_logp = tree["a_logp"] if a_logp is None else a_logp
    thought_adv, answer_adv = grpo_ma_advantages(tree["rewards"])
    t_w, a_w = grpo_ma_token_weights(
        tree["t_len"],
        tree["a_len"],
        aggregation=aggregation,
        thought_loss_weight=thought_loss_weight,
        max_completion_tokens=max_completion,
    )
    b, k, m, ta = tree["a_logp"].shape
    thought = Segments(
        t_logp.reshape(b * k, -1),
        length_mask(tree["t_len"], t_logp.shape[-1]).reshape(b * k, -1),
        thought_adv.reshape(-1),
        t_w.reshape(-1),
        tree["t_old"].reshape(b * k, -1),
        tree["t_ref"].reshape(b * k, -1),
    )
    answer = Segments(
        a_logp.reshape(b * k * m, ta),
        length_mask(tree["a_len"], ta).reshape(b * k * m, ta),
        answer_adv.reshape(-1),
        a_w.reshape(-1),
        tree["a_old"].reshape(-1, ta),
        tree["a_ref"].reshape(-1, ta),
    )
    out_t = policy_loss(thought, clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH, kl_beta=BETA)
    out_a = policy_loss(answer, clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH, kl_beta=BETA)
    return out_t.loss + out_a.loss


def concat_paths(tree, key_t, key_a, m):
    """Concatenate thought k with its answer m into one left-aligned GRPO completion per path."""
    b, k, tt = tree[key_t].shape
    rows = []
    for bi in range(b):
        for ki in range(k):
            tl, al = int(tree["t_len"][bi, ki]), int(tree["a_len"][bi, ki, m])
            row = torch.zeros(tt + tree[key_a].shape[-1], dtype=tree[key_t].dtype)
            row[:tl] = tree[key_t][bi, ki, :tl]
            row[tl : tl + al] = tree[key_a][bi, ki, m, :al]
            rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize(
    "loss_type,aggregation",
    [("grpo", "seq_mean_token_mean"), ("dapo", "token_mean"), ("dr_grpo", "seq_mean_token_sum_norm")],
)
@pytest.mark.parametrize("seed", range(3))
def test_m1_loss_and_gradient_equal_trl_grpo(loss_type, aggregation, seed):
    tree = random_tree(seed, batch=3, thoughts=4, answers=1, dtype=torch.float64)
    max_completion = 7 + 4
    t_logp = tree["t_logp"].clone().requires_grad_(True)
    a_logp = tree["a_logp"].clone().requires_grad_(True)
    loss = ours(tree, aggregation, t_logp, a_logp, max_completion=max_completion)
    loss.backward()

    t_ref_logp = tree["t_logp"].clone().requires_grad_(True)
    a_ref_logp = tree["a_logp"].clone().requires_grad_(True)
    with_grad = {**tree, "t_logp": t_ref_logp, "a_logp": a_ref_logp}
    logp = concat_paths(with_grad, "t_logp", "a_logp", 0)
    old = concat_paths(tree, "t_old", "a_old", 0)
    ref = concat_paths(tree, "t_ref", "a_ref", 0)
    mask = (torch.arange(logp.shape[1]) < (tree["t_len"] + tree["a_len"][..., 0]).reshape(-1, 1)).double()
    advantages = grpo_ma_advantages(tree["rewards"])[1].reshape(-1)
    expected = trl_grpo_loss(logp, old, ref, advantages, mask, loss_type, max_completion)
    expected.backward()

    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(t_logp.grad, t_ref_logp.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(a_logp.grad, a_ref_logp.grad, rtol=1e-9, atol=1e-12)


def test_each_thought_counts_once_not_m_times():
    """GRPO-MA loss = mean over the M paths of a GRPO-style loss on (thought ⊕ answer_m): the thought is weighted
    as one path, not as M duplicated sequences."""
    tree = random_tree(7, batch=2, thoughts=3, answers=4, dtype=torch.float64)
    thought_adv, answer_adv = grpo_ma_advantages(tree["rewards"])
    total = 0.0
    for m in range(4):
        logp = concat_paths(tree, "t_logp", "a_logp", m)
        old = concat_paths(tree, "t_old", "a_old", m)
        ref = concat_paths(tree, "t_ref", "a_ref", m)
        lengths = (tree["t_len"] + tree["a_len"][..., m]).reshape(-1, 1)
        mask = (torch.arange(logp.shape[1]) < lengths).double()
        # per-token advantages: thought advantage on thought tokens, the answer's own on answer tokens
        t_len = tree["t_len"].reshape(-1, 1)
        adv = torch.where(
            torch.arange(logp.shape[1]) < t_len, thought_adv.reshape(-1, 1), answer_adv[..., m].reshape(-1, 1)
        )
        ratio = torch.exp(logp - old)
        per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
        per_token = per_token + BETA * k3_kl(logp, ref)
        total = total + ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    torch.testing.assert_close(ours(tree, "seq_mean_token_mean"), total / 4, rtol=1e-10, atol=1e-12)


def test_thought_gradient_does_not_grow_with_m():
    """Duplicating identical answers (M=1 -> M=4) leaves the thought-token gradient unchanged."""
    base = random_tree(11, batch=2, thoughts=3, answers=1, dtype=torch.float64)
    wide = dict(base)
    for key in ("a_logp", "a_old", "a_ref"):
        wide[key] = base[key].expand(-1, -1, 4, -1).clone()
    wide["a_len"] = base["a_len"].expand(-1, -1, 4).clone()
    wide["rewards"] = base["rewards"].expand(-1, -1, 4).clone()
    grads = []
    for tree in (base, wide):
        t_logp = tree["t_logp"].clone().requires_grad_(True)
        ours(tree, "seq_mean_token_mean", t_logp=t_logp).backward()
        grads.append(t_logp.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_thought_loss_weight_scales_only_thought_part():
    tree = random_tree(5, batch=2, thoughts=3, answers=2, dtype=torch.float64)
    t_w1, a_w1 = grpo_ma_token_weights(tree["t_len"], tree["a_len"], thought_loss_weight=1.0)
    t_w2, a_w2 = grpo_ma_token_weights(tree["t_len"], tree["a_len"], thought_loss_weight=0.5)
    torch.testing.assert_close(t_w2, 0.5 * t_w1)
    torch.testing.assert_close(a_w2, a_w1)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"])
def test_gradient_matches_finite_differences(aggregation):
    tree = random_tree(3, batch=2, thoughts=2, answers=2, max_thought=3, max_answer=2, dtype=torch.float64)

    def loss_of(t_logp, a_logp):
        return ours(tree, aggregation, t_logp, a_logp, max_completion=5)

    # Keep every ratio away from the clip boundaries, where the objective has kinks.
    for key_new, key_old in (("t_logp", "t_old"), ("a_logp", "a_old")):
        ratio = torch.exp(tree[key_new] - tree[key_old])
        for bound in (1 - EPS_LOW, 1 + EPS_HIGH):
            near = (ratio - bound).abs() < 1e-3
            tree[key_old] = torch.where(near, tree[key_old] + 0.01, tree[key_old])
    inputs = (tree["t_logp"].clone().requires_grad_(True), tree["a_logp"].clone().requires_grad_(True))
    assert torch.autograd.gradcheck(loss_of, inputs, eps=1e-6, atol=1e-7)


def test_clip_fraction_on_constructed_ratios():
    ratios = torch.tensor([[0.5, 0.9, 1.1, 1.5], [0.5, 0.9, 1.1, 1.5]])
    logp = torch.log(ratios)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    out = policy_loss(
        Segments(logp, mask, advantages, torch.ones(2), old_logp=torch.zeros_like(logp)),
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        kl_beta=0.0,
    )
    # A > 0: only r = 1.5 > 1.2 is clipped; A < 0: only r = 0.5 < 0.8 (r = 1.5 is masked out).
    assert out.tokens == 7
    assert out.clip_high_fraction.item() == pytest.approx(1 / 7)
    assert out.clip_low_fraction.item() == pytest.approx(1 / 7)
    assert out.clip_fraction.item() == pytest.approx(2 / 7)


def test_clip_fractions_with_asymmetric_counts_and_bounds():
    """Two tokens clipped high and one low (low and high reported apart), asymmetric bounds, and a ratio
    exactly on a bound is not counted as clipped."""
    ratios = torch.tensor([[2.0, 2.0, 1.0, 1.5], [0.5, 0.25, 1.0, 2.0]], dtype=torch.float64)
    assert torch.equal(torch.exp(torch.log(ratios)), ratios)  # exact in float64: the bound tests are exact
    logp = torch.log(ratios).requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    out = policy_loss(
        Segments(
            logp,
            torch.ones(2, 4, dtype=torch.bool),
            advantages,
            torch.ones(2, dtype=torch.float64),
            old_logp=torch.zeros_like(logp),
        ),
        clip_eps_low=0.5,
        clip_eps_high=0.5,
        kl_beta=0.0,
    )
    # A > 0, bound 1.5: r = 2, 2 clipped high; r = 1.5 sits on the bound. A < 0, bound 0.5: r = 0.25 clipped
    # low; r = 0.5 on the bound; r = 2 is outside the bounds but on the side the min ignores.
    assert out.tokens == 8
    assert out.clip_high_fraction.item() == pytest.approx(2 / 8)
    assert out.clip_low_fraction.item() == pytest.approx(1 / 8)
    assert out.clip_fraction.item() == pytest.approx(3 / 8)
    out.loss.backward()
    # clipped tokens get no gradient, tokens inside the bounds -r·A (tokens on a bound: torch splits the tie)
    assert logp.grad[0, :2].tolist() == [0.0, 0.0] and logp.grad[1, 1].item() == 0.0
    assert logp.grad[0, 2].item() == -1.0 and logp.grad[1, 2:].tolist() == [1.0, 2.0]
    # unequal bounds: 1 + 0.5 above, 1 - 0.75 below; r = 1.625 lies between 1 + ε_high and 1 + ε_low
    ratios = torch.tensor([[2.0, 1.625, 1.0, 1.5], [0.5, 0.25, 1.0, 2.0]], dtype=torch.float64)
    unequal = policy_loss(
        Segments(
            torch.log(ratios),
            torch.ones(2, 4, dtype=torch.bool),
            advantages,
            torch.ones(2, dtype=torch.float64),
            old_logp=torch.zeros(2, 4, dtype=torch.float64),
        ),
        clip_eps_low=0.75,
        clip_eps_high=0.5,
        kl_beta=0.0,
    )
    assert unequal.clip_high_fraction.item() == pytest.approx(2 / 8)
    assert unequal.clip_low_fraction.item() == 0.0  # r = 0.25 is on the low bound 1 - 0.75


def test_clipped_tokens_have_zero_gradient_and_unclipped_have_minus_ratio_times_advantage():
    logp = torch.log(torch.tensor([[0.5, 1.0, 1.5]])).requires_grad_(True)
    out = policy_loss(
        Segments(
            logp,
            torch.ones(1, 3, dtype=torch.bool),
            torch.tensor([2.0]),
            torch.ones(1),
            old_logp=torch.zeros(1, 3),
        ),
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        kl_beta=0.0,
    )
    out.loss.backward()
    # A > 0: r = 0.5 uses the unclipped branch (min picks it), r = 1.5 is clipped -> zero gradient.
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5 * 2.0, -1.0 * 2.0, 0.0]]))


def test_first_epoch_ratio_is_one_but_gradient_is_the_policy_gradient():
    logp = (-torch.rand(2, 5, generator=torch.Generator().manual_seed(0))).requires_grad_(True)
    adv = torch.tensor([1.5, -0.5])
    out = policy_loss(
        Segments(logp, torch.ones(2, 5, dtype=torch.bool), adv, torch.full((2,), 0.1)),
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        kl_beta=0.0,
    )
    out.loss.backward()
    torch.testing.assert_close(out.loss, -(adv * 0.1 * 5).sum())
    torch.testing.assert_close(logp.grad, (-adv.unsqueeze(1) * 0.1).expand(2, 5))
    assert out.clip_fraction.item() == 0.0


def test_kl_term_k3_properties():
    logp = torch.log(torch.tensor([[0.2, 0.5, 0.9]]))
    assert torch.all(k3_kl(logp, logp) == 0)
    ref = torch.log(torch.tensor([[0.3, 0.1, 0.95]]))
    assert torch.all(k3_kl(logp, ref) > 0)
    segments = Segments(logp, torch.ones(1, 3, dtype=torch.bool), torch.zeros(1), torch.ones(1), ref_logp=ref)
    with_kl = policy_loss(segments, clip_eps_low=0.2, clip_eps_high=0.2, kl_beta=0.5)
    without = policy_loss(segments, clip_eps_low=0.2, clip_eps_high=0.2, kl_beta=0.0)
    torch.testing.assert_close(with_kl.loss, 0.5 * k3_kl(logp, ref).sum())
    assert without.loss.item() == 0.0 and without.kl.item() == 0.0
    torch.testing.assert_close(with_kl.kl, k3_kl(logp, ref).mean())


def test_reported_kl_is_the_token_weighted_mean():
    """The logged KL weighs each token by its segment's weight (a long and a short segment differ)."""
    logp = torch.log(torch.tensor([[0.2, 0.5, 0.9], [0.4, 0.4, 0.4]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.3, 0.1, 0.95], [0.1, 0.2, 0.3]], dtype=torch.float64))
    mask = torch.tensor([[True, True, True], [True, False, False]])
    weights = torch.tensor([1.0, 3.0], dtype=torch.float64)
    out = policy_loss(
        Segments(logp, mask, torch.zeros(2, dtype=torch.float64), weights, ref_logp=ref),
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        kl_beta=0.1,
    )
    k3 = k3_kl(logp, ref)
    expected = (k3[0].sum() * 1.0 + k3[1, 0] * 3.0) / (3 * 1.0 + 1 * 3.0)
    torch.testing.assert_close(out.kl, expected)
    torch.testing.assert_close(out.loss, 0.1 * (k3[0].sum() + 3.0 * k3[1, 0]))


def test_micro_batches_add_up_to_the_full_batch_loss():
    tree = random_tree(9, batch=4, thoughts=2, answers=3, dtype=torch.float64)
    thought_adv, _ = grpo_ma_advantages(tree["rewards"])
    t_w, _ = grpo_ma_token_weights(tree["t_len"], tree["a_len"], aggregation="token_mean")
    logp = tree["t_logp"].reshape(8, -1)
    mask = length_mask(tree["t_len"], logp.shape[1]).reshape(8, -1)

    def loss(rows):
        seg = Segments(
            logp[rows],
            mask[rows],
            thought_adv.reshape(-1)[rows],
            t_w.reshape(-1)[rows],
            tree["t_old"].reshape(8, -1)[rows],
            tree["t_ref"].reshape(8, -1)[rows],
        )
        return policy_loss(seg, clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH, kl_beta=BETA).loss

    torch.testing.assert_close(loss(slice(0, 3)) + loss(slice(3, 8)), loss(slice(0, 8)))


def test_token_weights_validate_inputs():
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        grpo_ma_token_weights(torch.ones(2, 3), torch.ones(2, 4, 1))
    with pytest.raises(ValueError, match="max_completion_tokens"):
        grpo_ma_token_weights(torch.ones(1, 2), torch.ones(1, 2, 2), aggregation="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        grpo_ma_token_weights(torch.ones(1, 2), torch.ones(1, 2, 2), aggregation="sum")


def test_segments_from_padded_flatten_answers_in_tree_order():
    tree = random_tree(4, batch=2, thoughts=3, answers=2)
    _, answer_adv = grpo_ma_advantages(tree["rewards"])
    _, a_w = grpo_ma_token_weights(tree["t_len"], tree["a_len"])
    mask = length_mask(tree["a_len"], tree["a_logp"].shape[-1])
    seg = Segments.from_padded(
        tree["a_logp"], mask, answer_adv, a_w, old_logp=tree["a_old"], ref_logp=tree["a_ref"]
    )
    assert seg.logp.shape == (12, 4) and seg.advantages.shape == (12,)
    # row (b, k, m) of the tree is segment (b*K + k)*M + m, for every tensor alike
    b, k, m = 1, 2, 0
    row = (b * 3 + k) * 2 + m
    torch.testing.assert_close(seg.logp[row], tree["a_logp"][b, k, m])
    torch.testing.assert_close(seg.old_logp[row], tree["a_old"][b, k, m])
    torch.testing.assert_close(seg.ref_logp[row], tree["a_ref"][b, k, m])
    assert torch.equal(seg.mask[row], mask[b, k, m])
    assert seg.advantages[row] == answer_adv[b, k, m] and seg.token_weights[row] == a_w[b, k, m]
    assert Segments.from_padded(tree["a_logp"], mask, answer_adv, a_w).old_logp is None


def test_segments_from_padded_refuse_disagreeing_shapes():
    logp, mask = torch.zeros(2, 3, 5), torch.ones(2, 3, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="segment shapes disagree"):
        Segments.from_padded(logp, mask, torch.zeros(2, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="segment shapes disagree"):
        Segments.from_padded(logp, mask[..., :4], torch.zeros(2, 3), torch.zeros(2, 3))


def test_loss_stats_weight_rates_by_tokens_and_average_losses_over_epochs():
    tree = random_tree(5, batch=2, thoughts=2, answers=2)
    thought_adv, answer_adv = grpo_ma_advantages(tree["rewards"])
    t_w, a_w = grpo_ma_token_weights(tree["t_len"], tree["a_len"])
    parts = [
        Segments.from_padded(
            tree["t_logp"],
            length_mask(tree["t_len"], 7),
            thought_adv,
            t_w,
            old_logp=tree["t_old"],
            ref_logp=tree["t_ref"],
        ),
        Segments.from_padded(
            tree["a_logp"],
            length_mask(tree["a_len"], 4),
            answer_adv,
            a_w,
            old_logp=tree["a_old"],
            ref_logp=tree["a_ref"],
        ),
    ]
    outputs = [policy_loss(p, clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH, kl_beta=BETA) for p in parts]
    stats = LossStats()
    for _ in range(2):  # two policy epochs over the same batch
        for output in outputs:
            stats.add(output)
    metrics = stats.metrics(epochs=2)
    tokens = outputs[0].tokens + outputs[1].tokens
    assert stats.tokens == 2 * tokens
    assert metrics["loss/total"] == pytest.approx(float(outputs[0].loss + outputs[1].loss))
    assert metrics["loss/policy"] == pytest.approx(float(outputs[0].policy_loss + outputs[1].policy_loss))
    expected_kl = sum(float(o.kl) * o.tokens for o in outputs) / tokens
    assert metrics["loss/kl"] == pytest.approx(expected_kl)
    expected_clip = sum(float(o.clip_fraction) * o.tokens for o in outputs) / tokens
    assert metrics["loss/clip_fraction"] == pytest.approx(expected_clip)
    assert 0 < metrics["loss/clip_fraction"] < 1
