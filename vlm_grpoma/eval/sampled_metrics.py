"""What ``eval --samples k`` adds to the mean over samples: pass@k and best-of-k per task.

pass@k is the probability that at least one of k samples drawn from the n a record got is correct, estimated
without bias as ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large Language Models Trained on
Code", eq. 1) and averaged over records. A sample is correct when it meets the task's success rule:

- detection: Acc@0.5 for a single-box record (the first box at IoU >= 0.5, RefCOCO's rule), else every
  ground-truth box matched one-to-one at IoU >= 0.5;
- affordance: every predicted point on the target;
- answer: the short answer is correct (the ``answer_match`` reward's 1): pass@k of the math papers.

Trajectories have no success rule: they get best-of-k only. best-of-k is each record's best sample by the
task's main score (detection ``iou``, affordance ``accuracy``, trajectory ``dfd``, lower is better, answer
``correct``),
averaged over records: an oracle that picks the best of k answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from vlm_grpoma.eval.grounding_metrics import EvalReport, ScoredPrediction

#: task -> does this scored sample meet the task's success rule.
SUCCESS_RULES: dict[str, Callable[[dict[str, float]], bool]] = {
    "detection": lambda s: s["Acc@0.5"] == 1.0 if "Acc@0.5" in s else s["matched@0.5"] == s["gt_boxes"] > 0,
    "affordance": lambda s: s["accuracy"] == 1.0,
    "answer": lambda s: s["correct"] == 1.0,
}
#: task -> (main per-sample score, True when higher is better) for best-of-k.
BEST_OF: dict[str, tuple[str, bool]] = {
    "detection": ("iou", True),
    "affordance": ("accuracy", True),
    "trajectory": ("dfd", False),
    "answer": ("correct", True),
}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one record with ``c`` correct among ``n`` samples (Chen et al. 2021's stable form:
    ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def report_ks(samples: int) -> list[int]:
    """The k reported for ``samples`` per record: 1, the powers of two below it, and ``samples`` itself."""
    ks = {1, samples}
    k = 2
    while k < samples:
        ks.add(k)
        k *= 2
    return sorted(ks)


def _by_record(predictions: Sequence[ScoredPrediction], task: str) -> dict[str, list[ScoredPrediction]]:
    groups: dict[str, list[ScoredPrediction]] = {}
    for p in predictions:
        if p.prediction.record.task == task:
            groups.setdefault(p.prediction.record.id, []).append(p)
    return groups


def sampled_metrics(report: EvalReport) -> dict[str, dict[str, float]]:
    """``pass@k`` (each reported k) and ``best_of_k/<score>`` per task of a sampled report."""
    ks = report_ks(report.samples)
    out: dict[str, dict[str, float]] = {}
    for task in report.tasks:
        groups = _by_record(report.predictions, task)
        metrics: dict[str, float] = {}
        rule = SUCCESS_RULES.get(task)
        if rule is not None:
            correct = [(len(g), sum(rule(p.scores) for p in g)) for g in groups.values()]
            for k in ks:
                metrics[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for n, c in correct]))
        score, higher = BEST_OF[task]
        pick = max if higher else min
        metrics[f"best_of_{report.samples}/{score}"] = float(
            np.mean([pick(p.scores[score] for p in g) for g in groups.values()])
        )
        out[task] = metrics
    return out


def add_sampled_metrics(report: EvalReport) -> None:
    """Put :func:`sampled_metrics` beside the means in each task's metrics (a sampled report only)."""
    if report.samples < 2:
        return
    for task, metrics in sampled_metrics(report).items():
        report.tasks[task].metrics.update(metrics)


__all__ = ["BEST_OF", "SUCCESS_RULES", "add_sampled_metrics", "pass_at_k", "report_ks", "sampled_metrics"]
