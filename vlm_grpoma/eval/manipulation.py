"""``vlm-grpoma manip-eval``: manipulation success per category on seen or unseen objects.

Episodes are sampled deterministically from ``--seed`` (categories round-robin, held-out instances for
``seen``, held-out categories for ``unseen``), the policy proposes one ContactAction per episode, and the
simulator pool executes them. Policies: ``oracle`` (contact on the target's handle, pull along the joint's
opening direction), ``random`` (uniform pixel, isotropic directions) and ``model`` (greedy answer of
``--checkpoint`` on the episode's rendered image, saved under ``<out stem>_images/``). Writes ``--out`` (JSON), the same name with ``.md`` (Markdown table) and,
where rendering works, ``.png`` (a grid of images with the predicted contacts, green = success).
Aggregates are sample-weighted over categories, as ManipLLM reports them.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from vlm_grpoma.answers import ContactAction, ParseError
from vlm_grpoma.config import Config
from vlm_grpoma.envs.sapien.camera import render
from vlm_grpoma.envs.sapien.pool import SimPool
from vlm_grpoma.envs.sapien.task import EpisodeSpec, Outcome, prepare
from vlm_grpoma.envs.sapien.vulkan import rendering_status
from vlm_grpoma.errors import CommandError
from vlm_grpoma.eval.loading import eval_config, model_folder
from vlm_grpoma.eval.report import Tile, contact_grid, success_table

GRID_TILES = 12


def random_action(spec: EpisodeSpec, seed: int, index: int) -> ContactAction:
    """A uniformly random pixel with random (Gaussian, so isotropic) up and forward directions."""
    rng = np.random.default_rng([seed, index, 424242])
    point = (float(rng.uniform(0, spec.camera.width)), float(rng.uniform(0, spec.camera.height)))
    up, forward = rng.normal(size=3), rng.normal(size=3)
    return ContactAction(point, tuple(float(v) for v in up), tuple(float(v) for v in forward))


def sample_episodes(
    pool: SimPool, split: str, episodes: int, seed: int
) -> list[tuple[EpisodeSpec, ContactAction]]:
    results = pool.map([("sample", (split, i, seed), {}) for i in range(episodes)])
    for i, r in enumerate(results):
        if not isinstance(r, tuple):
            raise CommandError(f"could not sample episode {i} of split {split!r}: {r}")
    return results


def summarise(
    policy: str, split: str, seed: int, specs: list[EpisodeSpec], actions: list, outcomes: list[Outcome]
) -> dict:
    per_category: dict[str, list[bool]] = defaultdict(list)
    for spec, outcome in zip(specs, outcomes):
        per_category[spec.category].append(outcome.success)
    rows = {
        c: {"episodes": len(v), "successes": int(sum(v)), "success_rate": float(np.mean(v))}
        for c, v in per_category.items()
    }
    successes = sum(o.success for o in outcomes)
    return {
        "policy": policy,
        "split": split,
        "seed": seed,
        "per_category": rows,
        "aggregate": {
            "episodes": len(outcomes),
            "successes": int(successes),
            "success_rate": successes / max(1, len(outcomes)),
        },
        "failures": dict(Counter(o.failure for o in outcomes if o.failure)),
        "mean_joint_progress": float(np.mean([o.progress for o in outcomes])) if outcomes else 0.0,
        "episodes": [
            {
                "category": s.category,
                "object_seed": s.seed,
                "target_link": s.target_link,
                "point_2d": list(a.point) if isinstance(a, ContactAction) else None,
                "success": o.success,
                "failure": o.failure,
                "delta_q": o.delta_q,
                "direction_cos": o.direction_cos,
            }
            for s, a, o in zip(specs, actions, outcomes)
        ],
    }


def model_actions(
    checkpoint: str, split: str, seed: int, sampled: list, image_dir: Path, config: Config | None = None
) -> list:
    """Greedy ContactAction (or ParseError) of a checkpoint for each episode, from its rendered image, through
    the model adapter and the transformers rollout engine (the same path as training and grounding eval).

    ``config``: the run config the checkpoint was trained with — its model settings (pixel bounds, prompt
    style, which fix the coordinate frame) and rollout budgets; default: the run's saved config."""
    if not checkpoint or not Path(checkpoint).is_dir():
        raise CommandError(
            f"--policy model needs --checkpoint DIR (a Hugging Face model folder), got {checkpoint!r}"
        )
    ok, reason = rendering_status(in_process=True)
    if not ok:
        raise CommandError(f"--policy model needs rendered images but rendering is unavailable: {reason}")
    from vlm_grpoma.datasets.synthetic.sapien import render_record
    from vlm_grpoma.eval.grounding import generate_predictions, sampling_params
    from vlm_grpoma.eval.loading import load_for_eval

    records = [
        render_record("manipulation", f"manip-eval-{split}-{seed}-{i:06d}", split, spec, oracle, image_dir)
        for i, (spec, oracle) in enumerate(sampled)
    ]
    records = [replace(r, image=str(image_dir / r.image)) for r in records]
    # Loading (full or LoRA folder, run config, accelerator, rollout backend) is shared with ``eval``.
    model_dir = model_folder(checkpoint)
    config = config or eval_config(model_dir).config
    loaded = load_for_eval(model_dir, config)
    print(f"model: {loaded.describe()}")
    params = sampling_params(config.rollout, True, 1, seed)
    predictions = generate_predictions(loaded.model, loaded.adapter, records, params, engine=loaded.rollout)
    return [p.answer for p in predictions]


def run_config(args: argparse.Namespace) -> Config | None:
    """``--policy model``: ``--config``, else the checkpoint run's saved config (overrides applied), printed."""
    if args.policy != "model" or not args.checkpoint or not Path(args.checkpoint).is_dir():
        return None  # model_actions reports a missing checkpoint
    resolved = eval_config(
        model_folder(args.checkpoint), getattr(args, "config", None), getattr(args, "overrides", ())
    )
    print(f"config: {resolved.source}")
    return resolved.config


def evaluate(
    policy: str,
    split: str,
    episodes: int,
    seed: int,
    workers: int,
    checkpoint: str = "",
    image_dir: Path | None = None,
    config: Config | None = None,
) -> tuple[dict, list]:
    """Sample, act, execute; returns the result dict and the (spec, action, outcome) triples. An answer the
    model got wrong in form is a failed episode with reason ``parse:<reason>``."""
    with SimPool(workers) as pool:
        sampled = sample_episodes(pool, split, episodes, seed)
        specs = [spec for spec, _ in sampled]
        if policy == "model":
            actions = model_actions(
                checkpoint, split, seed, sampled, image_dir or Path("manip-eval-images"), config
            )
        else:
            actions = [
                oracle if policy == "oracle" else random_action(spec, seed, i)
                for i, (spec, oracle) in enumerate(sampled)
            ]
        valid = [i for i, a in enumerate(actions) if isinstance(a, ContactAction)]
        executed = pool.execute([(specs[i], actions[i]) for i in valid])
    outcomes = [Outcome.failed(f"parse:{a.reason}") if isinstance(a, ParseError) else None for a in actions]
    for i, outcome in zip(valid, executed):
        outcomes[i] = outcome
    return summarise(policy, split, seed, specs, actions, outcomes), list(zip(specs, actions, outcomes))


def render_grid(triples: list, path: Path) -> Path | None:
    ok, _ = rendering_status(in_process=True)
    if not ok:
        return None
    tiles = []
    for spec, action, outcome in triples[:GRID_TILES]:
        views = render(prepare(spec, render=True), spec.camera)
        caption = f"{spec.category}: {'ok' if outcome.success else outcome.failure or 'no motion'}"
        point = action.point if isinstance(action, ContactAction) else None
        tiles.append(Tile(views.rgb, point, caption, outcome.success))
    return contact_grid(tiles, path)


def main(args: argparse.Namespace) -> int:
    if args.episodes <= 0:
        raise CommandError(f"--episodes must be positive, got {args.episodes}")
    if args.workers < 0:
        raise CommandError(f"--workers must be >= 0, got {args.workers}")
    start = time.perf_counter()
    out = Path(args.out)
    result, triples = evaluate(
        args.policy,
        args.split,
        args.episodes,
        args.seed,
        args.workers,
        checkpoint=args.checkpoint,
        image_dir=out.with_name(out.stem + "_images"),
        config=run_config(args),
    )
    result["seconds"] = round(time.perf_counter() - start, 2)
    out.parent.mkdir(parents=True, exist_ok=True)
    grid = render_grid(triples, out.with_suffix(".png"))
    result["grid"] = str(grid) if grid else None
    out.write_text(json.dumps(result, indent=2))
    table = success_table(result)
    out.with_suffix(".md").write_text(table)
    print(table, end="")
    print(
        f"wrote {out}, {out.with_suffix('.md')}"
        + (f", {grid}" if grid else " (no grid: rendering unavailable)")
    )
    return 0
