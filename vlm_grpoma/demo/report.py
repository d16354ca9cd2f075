"""What the manipulation demo prints and draws: the stage table, the paired before/after comparison, the
training plot and the grid of contacts on held-out objects."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlm_grpoma.answers import ContactAction
from vlm_grpoma.datasets.images import load_image
from vlm_grpoma.demo.heldout import Episode, SetResult
from vlm_grpoma.envs.sapien.task import EpisodeSpec
from vlm_grpoma.eval.manipulation_report import Tile, contact_grid
from vlm_grpoma.eval.proportions import PairedChange, paired_change, wilson


@dataclass(frozen=True)
class StageResult:
    """One row of the table: a checkpoint's held-out results and its training stage's seconds per step."""

    name: str
    sets: dict[str, SetResult]
    seconds_per_step: float | None


def _rate_cell(result: SetResult) -> str:
    rate = result.rate
    return f"{rate.value:.3f} [{rate.low:.3f}, {rate.high:.3f}]"


def stage_table(stages: Sequence[StageResult]) -> str:
    """Success rate with its 95 % Wilson interval per held-out set, parse rate over all sets, s/step."""
    names = list(stages[0].sets)
    columns = [f"{name} success ({len(stages[0].sets[name].episodes)} ep.)" for name in names]
    lines = [f"{'stage':<14} " + " ".join(f"{c:<22}" for c in columns) + f" {'parsed':>6} {'s/step':>7}"]
    for stage in stages:
        episodes = sum(len(r.episodes) for r in stage.sets.values())
        parsed = sum(r.parsed for r in stage.sets.values()) / episodes
        per_step = "—" if stage.seconds_per_step is None else f"{stage.seconds_per_step:.2f}"
        cells = " ".join(f"{_rate_cell(stage.sets[name]):<22}" for name in names)
        lines.append(f"{stage.name:<14} {cells} {parsed:6.2f} {per_step:>7}")
    return "\n".join(lines)


def parse_failure_lines(stages: Sequence[StageResult]) -> list[str]:
    """Why answers did not parse, per trained stage and held-out set that has any (the untrained model parses
    nothing, so it is left out)."""
    lines = []
    for stage in stages[1:]:
        for name, result in stage.sets.items():
            if failures := result.parse_failures():
                reasons = ", ".join(f"{reason} {count}" for reason, count in failures.items())
                lines.append(f"unparsed {stage.name}, {name}: {reasons}")
    return lines


def changes(before: StageResult, after: StageResult) -> dict[str, PairedChange]:
    """Per held-out set, the paired change of success from ``before`` to ``after`` (same episodes)."""
    return {
        name: paired_change(
            [e.success for e in before.sets[name].episodes], [e.success for e in after.sets[name].episodes]
        )
        for name in before.sets
    }


def change_lines(before: StageResult, after: StageResult) -> str:
    lines = [
        f"{after.name} - {before.name}, same held-out episodes (95 % Newcombe interval; exact McNemar p):"
    ]
    for name, change in changes(before, after).items():
        lines.append(
            f"  {name:<7} {change.difference:+.3f} [{change.low:+.3f}, {change.high:+.3f}]  "
            f"{change.gained} episodes newly solved, {change.lost} lost, of {change.after.trials}; "
            f"p = {change.p_value:.2g}"
        )
    return "\n".join(lines)


def plot_training(sft: list[dict], grpo: list[dict], sets: Sequence[str], path: Path) -> Path:
    """Left: the SFT loss. Right: GRPO-MA's training reward per step and held-out greedy success (with 95 %
    Wilson intervals) at each evaluation step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 1.6]})
    left.plot([m["step"] for m in sft], [m["sft/nll"] for m in sft], color="tab:blue")
    left.set(title="SFT warm start", xlabel="step", ylabel="target NLL per token", yscale="log")

    trained = [m for m in grpo if "reward/total_mean" in m]
    steps = np.array([m["step"] for m in trained])
    reward = np.array([m["reward/total_mean"] for m in trained])
    window = min(10, len(reward))
    right.plot(steps, reward, color="tab:green", alpha=0.3)
    right.plot(
        steps[window - 1 :],
        np.convolve(reward, np.ones(window) / window, mode="valid"),
        color="tab:green",
        label=f"training reward: success + 0.2 x format of the sampled answers ({window}-step mean)",
    )
    for name, colour in zip(sets, ("tab:red", "tab:purple", "tab:brown")):
        key = f"eval/{name}/manipulation/success_mean"
        points = [m for m in grpo if key in m]
        xs = [m["step"] for m in points]
        rates = [
            wilson(round(m[key] * m[f"eval/{name}/records"]), int(m[f"eval/{name}/records"])) for m in points
        ]
        ys = [r.value for r in rates]
        errors = [[y - r.low for y, r in zip(ys, rates)], [r.high - y for y, r in zip(ys, rates)]]
        right.errorbar(
            xs,
            ys,
            yerr=errors,
            color=colour,
            marker="o",
            capsize=3,
            label=f"held-out success, {name} ({int(points[0][f'eval/{name}/records'])} episodes, greedy)",
        )
    right.set(
        title="GRPO-MA (T4A4) from the SFT model",
        xlabel="GRPO-MA step",
        ylabel="training reward  |  held-out success rate",
        ylim=(0, 1.25),
    )
    right.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tile(caption: str, episode: Episode) -> Tile:
    category = EpisodeSpec.from_meta(episode.record.meta).category
    if isinstance(episode.answer, ContactAction):
        point, outcome = episode.answer.point, "ok" if episode.success else "failed"
    else:
        point, outcome = None, "no answer"
    image = np.asarray(load_image(episode.record))
    return Tile(image, point, f"{caption}: {category} {outcome}", episode.success)


def contact_grid_png(before: StageResult, after: StageResult, per_set: int, path: Path) -> Path:
    """The first ``per_set`` episodes of every held-out set, one row per (set, stage): the predicted contact
    on each object (green = success, red = failure). Episodes are taken in order, not chosen."""
    tiles = [
        _tile(f"{name} {stage.name.removeprefix('after ')}", episode)
        for name in before.sets
        for stage in (before, after)
        for episode in stage.sets[name].episodes[:per_set]
    ]
    return contact_grid(tiles, path, columns=per_set)
