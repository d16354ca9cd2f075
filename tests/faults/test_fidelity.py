"""Fidelity found while testing faults: the KL estimator of each TRL setting, and SFT targets that always parse."""

from __future__ import annotations

import pytest
import torch

from vlm_grpoma.algorithm.loss import Segments, policy_loss
from vlm_grpoma.answers import Box, Boxes, CoordinateFrame, format_answer, parse_answer

EPS_LOW, EPS_HIGH, BETA = 0.2, 0.28, 0.04


def trl_grpo_loss(logp, old_logp, ref_logp, advantages, mask, use_bias_correction_kl):
    """TRL GRPOTrainer ``_compute_loss`` for ``loss_type="grpo"``, token-level importance sampling, re-written from
    trl 1.16.0 (PyPI wheel, ``trl/trainer/grpo_trainer.py``: ``coef_1 = exp(log_ratio)``; ``per_token_kl =
    exp(ref - logp) - (ref - logp) - 1``; ``if use_bias_correction_kl: per_token_kl = per_token_kl * coef_1``;
    ``use_bias_correction_kl`` defaults to True in ``grpo_config.py``). The same lines are at huggingface/trl
    commit f2cd57710ae345ea6428ae95363267fcf38a3dc8 (1.10.0.dev0), where the default was still False."""
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - EPS_LOW, 1 + EPS_HIGH)
    per_token_kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    if use_bias_correction_kl:
        per_token_kl = per_token_kl * coef_1
    a = advantages.unsqueeze(1)
    per_token = -torch.min(coef_1 * a, coef_2 * a) + BETA * per_token_kl
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


@pytest.mark.parametrize("estimator,bias_correction", [("k3", False), ("k3_ratio", True)])
@pytest.mark.parametrize("on_policy", [True, False])
def test_m1_kl_term_equals_trl_in_value_and_gradient(estimator, bias_correction, on_policy):
    gen = torch.Generator().manual_seed(7)
    rows, width = 6, 9
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = torch.arange(width) < lengths.unsqueeze(1)
    base = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 3
    ref = base - torch.randn(rows, width, generator=gen, dtype=torch.float64) * 0.3
    old = None if on_policy else base + torch.randn(rows, width, generator=gen, dtype=torch.float64) * 0.1
    advantages = torch.randn(rows, generator=gen, dtype=torch.float64)

    ours_logp = base.clone().requires_grad_(True)
    loss = policy_loss(
        Segments(ours_logp, mask, advantages, 1.0 / (lengths.double() * rows), old_logp=old, ref_logp=ref),
        clip_eps_low=EPS_LOW,
        clip_eps_high=EPS_HIGH,
        kl_beta=BETA,
        kl_estimator=estimator,
    ).loss
    loss.backward()

    trl_logp = base.clone().requires_grad_(True)
    trl_old = trl_logp.detach() if on_policy else old
    expected = trl_grpo_loss(trl_logp, trl_old, ref, advantages, mask.double(), bias_correction)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours_logp.grad, trl_logp.grad, rtol=0, atol=1e-12)


def test_the_two_estimators_differ_in_gradient_not_in_value_on_policy():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    grads, values = [], []
    for estimator in ("k3", "k3_ratio"):
        logp.grad = None
        out = policy_loss(
            Segments(
                logp,
                torch.ones(1, 2, dtype=torch.bool),
                torch.zeros(1),
                torch.ones(1),
                ref_logp=torch.tensor([[-1.5, -1.0]]),
            ),
            clip_eps_low=0.2,
            clip_eps_high=0.2,
            kl_beta=1.0,
            kl_estimator=estimator,
        )
        out.loss.backward()
        grads.append(logp.grad.clone())
        values.append(float(out.loss.detach()))
    assert values[0] == pytest.approx(values[1], abs=1e-7)
    assert not torch.allclose(grads[0], grads[1])


@pytest.mark.parametrize(
    "frame,box",
    [
        (CoordinateFrame.resized(640, 480, 224, 168), Box(639.8, 10.0, 640.0, 30.0)),  # right edge, sub-unit
        (CoordinateFrame.resized(640, 480, 224, 168), Box(0.0, 479.5, 20.0, 480.0)),  # bottom edge
        (CoordinateFrame.resized(640, 480, 224, 168), Box(0.0, 0.0, 0.4, 0.6)),  # top-left corner
        (CoordinateFrame.normalised(5000, 5000, 1000), Box(2500.0, 2500.0, 2501.0, 2502.0)),  # inside
        (CoordinateFrame.normalised(5000, 5000, 1000), Box(4999.0, 4999.0, 5000.0, 5000.0)),  # far corner
    ],
)
def test_a_sub_unit_box_is_written_as_a_box_that_parses_inside_the_frame(frame, box):
    model = frame.from_pixels(Boxes((box,)))
    rounded = Boxes(tuple(Box(*(round(v) for v in (b.x1, b.y1, b.x2, b.y2))) for b in model.boxes))
    assert rounded.boxes[0].x1 == rounded.boxes[0].x2 or rounded.boxes[0].y1 == rounded.boxes[0].y2
    text = format_answer(rounded)
    parsed = parse_answer(text, "boxes", bounds=(frame.model_width, frame.model_height))
    assert isinstance(parsed, Boxes), (text, parsed)
    (b,) = parsed.boxes
    assert b.x2 - b.x1 >= 1 and b.y2 - b.y1 >= 1
    assert 0 <= b.x1 and 0 <= b.y1 and b.x2 <= frame.model_width and b.y2 <= frame.model_height
