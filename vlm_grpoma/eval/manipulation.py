"""``vlm-grpoma manip-eval``: manipulation success per category on seen and unseen objects, reported as the
literature reports it.

Objects: procedural (the default: the seen categories' held-out instances and the unseen categories of
``envs.sapien.objects``) or, with ``--assets DIR``, PartNet-Mobility folders split by category with
``--split-file`` (default: ManipLLM's lists, shipped with the package): ``seen`` = test instances of seen
categories, ``unseen`` = unseen categories. ``--protocol`` says how actions run (``envs.sapien.protocol``):
``manipllm`` (the default with ``--assets``) or ``simple`` (the default, and the only choice, without).
``--episodes`` per split, categories round-robin (objects round-robin within a category), episode seeds from
``--seed``: the same command gives the same episodes with any number of workers.

Policies: ``oracle`` (procedural: contact on the target's handle, pulled along the opening direction;
``manipllm``: ManipLLM's successful demonstration), ``random`` (uniform pixel, isotropic directions) and
``model`` (greedy answer of ``--checkpoint`` on the episode's rendered image, saved under
``<out stem>_images/``). Writes ``--out`` (JSON), the same name with ``.md`` (Markdown table) and, where
rendering works, ``.png`` (images with the predicted contacts, green = success; rendered after the JSON and
table are written, so its failure costs only the picture); the output folder is checked writable before the
work. Per category: episodes,
successes, success rate with its 95 % Wilson score interval, and the rate over answers whose contact hit a
movable part (ManipLLM's test script drops the other answers from its denominator); then each split's
sample-weighted aggregate (all its episodes pooled), as ManipLLM reports them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from vlm_grpoma.answers import ContactAction, ParseError
from vlm_grpoma.config import Config
from vlm_grpoma.datasets.schema import with_images
from vlm_grpoma.envs.sapien.partnet import scan_assets
from vlm_grpoma.envs.sapien.pool import HARD_DEADLINE_SLACK_S, SimPool, WorkerCrash
from vlm_grpoma.envs.sapien.protocol import PROTOCOLS
from vlm_grpoma.envs.sapien.splits import load_split, no_objects_message, round_robin
from vlm_grpoma.envs.sapien.task import DEFAULT_EXEC, EpisodeSpec, Outcome, render_episode
from vlm_grpoma.envs.sapien.views import parse_views
from vlm_grpoma.envs.sapien.vulkan import rendering_status
from vlm_grpoma.errors import CommandError, StorageError
from vlm_grpoma.eval.loading import eval_config, model_folder
from vlm_grpoma.eval.manipulation_report import INTERVAL, Tile, contact_grid, rate_row, success_table
from vlm_grpoma.output_folder import writable_folder
from vlm_grpoma.sampling import SamplingParams

GRID_TILES = 12
EVAL_SPLITS = ("seen", "unseen")
#: failures that mean the answer's contact never reached a movable part (ManipLLM drops such answers)
OFF_PART = ("invalid_action", "off_image", "off_object", "non_movable")
#: times a sampling job runs again after its worker died or froze (sampling is deterministic, so it is safe)
SAMPLE_RETRIES = 2
#: seconds one simulator job may run before its worker is killed as frozen (``--job-timeout``)
DEFAULT_JOB_TIMEOUT_S = DEFAULT_EXEC.timeout_s + HARD_DEADLINE_SLACK_S


def random_action(spec: EpisodeSpec, seed: int, index: int) -> ContactAction:
    """A uniformly random pixel with random (Gaussian, so isotropic) up and forward directions."""
    rng = np.random.default_rng([seed, index, 424242])
    point = (float(rng.uniform(0, spec.camera.width)), float(rng.uniform(0, spec.camera.height)))
    up, forward = rng.normal(size=3), rng.normal(size=3)
    return ContactAction(point, tuple(float(v) for v in up), tuple(float(v) for v in forward))


def sample_split(
    pool: SimPool, split: str, episodes: int, seed: int, assets=None, split_def=None, protocol: str = "simple"
) -> tuple[list[tuple[EpisodeSpec, ContactAction]], int]:
    """Episodes of a split and how many were dropped (asset objects with no successful demonstration).

    Sampling depends only on its arguments, so a job whose worker dies or freezes runs again on a fresh
    worker (SAMPLE_RETRIES times) and the episodes are the same as in an undisturbed run."""
    if assets is None:
        results = pool.map(
            [("sample", (split, i, seed), {}) for i in range(episodes)], retries=SAMPLE_RETRIES
        )
        for i, r in enumerate(results):
            if not isinstance(r, tuple):
                raise CommandError(f"could not sample episode {i} of split {split!r}: {_failure(r)}")
        return results, 0
    chosen = round_robin(assets, split_def, split, episodes)
    if not chosen:
        raise CommandError(
            no_objects_message(assets, split_def, split, f"--assets {assets[0].folder.parent}")
        )
    jobs = [
        ("sample_asset", (str(a.folder), seed * 1_000_003 + i, protocol), {}) for i, a in enumerate(chosen)
    ]
    results = pool.map(jobs, retries=SAMPLE_RETRIES)
    for asset, r in zip(chosen, results):
        if isinstance(r, WorkerCrash):
            raise CommandError(f"could not sample an episode on {asset.folder} ({split}): {_failure(r)}")
    kept = [r for r in results if isinstance(r, tuple)]
    return kept, len(results) - len(kept)


def _failure(result) -> str:
    if isinstance(result, WorkerCrash):
        what = "froze" if result.reason == "timeout" else "died"
        return f"the simulator worker {what} on each of {result.attempts} attempts ({result.detail})"
    return str(result)


def summarise(
    policy: str,
    seed: int,
    specs: list[EpisodeSpec],
    splits: list[str],
    actions: list,
    outcomes: list[Outcome],
) -> dict:
    per: dict[str, list[Outcome]] = defaultdict(list)
    split_of: dict[str, str] = {}
    for spec, split, outcome in zip(specs, splits, outcomes):
        per[spec.category].append(outcome)
        split_of[spec.category] = split

    def row(group: list[Outcome]) -> dict:
        on_part = [o for o in group if not (o.failure in OFF_PART or o.failure.startswith("parse:"))]
        return rate_row(
            sum(o.success for o in group), len(group), sum(o.success for o in on_part), len(on_part)
        )

    per_category = {c: {"split": split_of[c]} | row(v) for c, v in per.items()}
    aggregates = {}
    for split in dict.fromkeys(splits):
        categories = [c for c in per if split_of[c] == split]
        aggregates[split] = {"categories": len(categories)} | row([o for c in categories for o in per[c]])
    return {
        "policy": policy,
        "seed": seed,
        "interval": INTERVAL,
        "per_category": per_category,
        "aggregates": aggregates,
        "failures": dict(Counter(o.failure for o in outcomes if o.failure)),
        "mean_joint_progress": float(np.mean([o.progress for o in outcomes])) if outcomes else 0.0,
        "episodes": [
            {
                "split": split,
                "category": s.category,
                "object": s.urdf or s.seed,
                "target_link": s.target_link,
                "point_2d": list(a.point) if isinstance(a, ContactAction) else None,
                "success": o.success,
                "failure": o.failure,
                "link": o.link,
                "delta_q": o.delta_q,
                "direction_cos": o.direction_cos,
            }
            for s, split, a, o in zip(specs, splits, actions, outcomes)
        ],
    }


def model_actions(
    checkpoint: str,
    sampled: list,
    splits: list[str],
    seed: int,
    image_dir: Path,
    config: Config | None = None,
    views: tuple[str, ...] = ("front",),
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
    from vlm_grpoma.eval.grounding import generate_predictions
    from vlm_grpoma.eval.loading import load_for_eval

    records = [
        render_record(
            "manipulation", f"manip-eval-{split}-{seed}-{i:06d}", split, spec, oracle, image_dir, views
        )
        for i, ((spec, oracle), split) in enumerate(zip(sampled, splits))
    ]
    records = [
        with_images(r, tuple(str(image_dir / p) for p in r.prompt_images), r.target_image) for r in records
    ]
    # Loading (full or LoRA folder, run config, accelerator, rollout backend) is shared with ``eval``.
    model_dir = model_folder(checkpoint)
    config = config or eval_config(model_dir).config
    loaded = load_for_eval(model_dir, config)
    print(f"model: {loaded.describe()}")
    params = SamplingParams.from_config(config.rollout, seed, greedy=True)
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
    splits: tuple[str, ...],
    episodes: int,
    seed: int,
    workers: int,
    checkpoint: str = "",
    image_dir: Path | None = None,
    config: Config | None = None,
    assets: str | Path | None = None,
    split_file: str | Path | None = None,
    protocol: str | None = None,
    job_timeout_s: float = DEFAULT_JOB_TIMEOUT_S,
    views: tuple[str, ...] = ("front",),
) -> tuple[dict, list]:
    """Sample ``episodes`` per split, act, execute; returns the result dict and the (spec, action, outcome)
    triples. An answer the model got wrong in form is a failed episode with reason ``parse:<reason>``; a
    worker that freezes for ``job_timeout_s`` is killed and replaced."""
    protocol = protocol or ("manipllm" if assets else "simple")
    if protocol not in PROTOCOLS:
        raise CommandError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if assets is None and protocol != "simple":
        raise CommandError(
            f"--protocol {protocol} runs on PartNet-Mobility objects: give --assets DIR "
            "(`vlm-grpoma make-assets --out DIR` writes generated ones)"
        )
    if assets is None and split_file is not None:
        raise CommandError("--split-file splits PartNet-Mobility objects: give --assets DIR too")
    objects = scan_assets(assets) if assets is not None else None
    split_def = load_split(split_file) if assets is not None else None
    sampled, split_names, dropped = [], [], {}
    with SimPool(workers, job_deadline_s=job_timeout_s) as pool:
        for split in splits:
            kept, dropped[split] = sample_split(pool, split, episodes, seed, objects, split_def, protocol)
            sampled += kept
            split_names += [split] * len(kept)
        specs = [spec for spec, _ in sampled]
        if policy == "model":
            image_dir = image_dir or Path("manip-eval-images")
            actions = model_actions(checkpoint, sampled, split_names, seed, image_dir, config, views)
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
    result = {
        "protocol": protocol,
        "objects": str(Path(assets).resolve()) if assets is not None else "procedural",
        "split_file": f"{split_def.name} ({split_def.source})" if split_def else "procedural categories",
        "dropped": dropped,
    } | summarise(policy, seed, specs, split_names, actions, outcomes)
    return result, list(zip(specs, actions, outcomes))


def render_grid(triples: list, path: Path) -> Path | None:
    """Up to GRID_TILES contacts, spread over the categories, on their rendered images."""
    ok, _ = rendering_status(in_process=True)
    if not ok:
        return None
    by_category: dict[str, list] = defaultdict(list)
    for triple in triples:
        by_category[triple[0].category].append(triple)
    spread = []
    for rank in range(max((len(group) for group in by_category.values()), default=0)):
        spread += [group[rank] for group in by_category.values() if rank < len(group)]
    tiles = []
    for spec, action, outcome in spread[:GRID_TILES]:
        _, views = render_episode(spec)
        caption = f"{spec.category}: {'ok' if outcome.success else outcome.failure or 'no motion'}"
        point = action.point if isinstance(action, ContactAction) else None
        tiles.append(Tile(views.rgb, point, caption, outcome.success))
    return contact_grid(tiles, path)


def manip_views(args: argparse.Namespace) -> tuple[str, ...]:
    """``--views``: the cameras the model sees each episode through (those it was trained on)."""
    if getattr(args, "views", None) and args.policy != "model":
        raise CommandError("--views applies to --policy model (the cameras the model sees)")
    try:
        return parse_views(getattr(args, "views", None) or "front")
    except ValueError as err:
        raise CommandError(f"--views: {err}") from None


def main(args: argparse.Namespace) -> int:
    if args.episodes <= 0:
        raise CommandError(f"--episodes must be positive, got {args.episodes}")
    if args.workers < 0:
        raise CommandError(f"--workers must be >= 0, got {args.workers}")
    job_timeout = DEFAULT_JOB_TIMEOUT_S if args.job_timeout is None else args.job_timeout
    if not (math.isfinite(job_timeout) and job_timeout > 0):
        raise CommandError(f"--job-timeout must be a positive number of seconds, got {args.job_timeout}")
    start = time.perf_counter()
    out = Path(args.out)
    if out.is_dir():
        raise CommandError(f"--out {out}: is a folder; name the results JSON file")
    writable_folder(out.parent, "--out")  # before the work, not after it
    splits = EVAL_SPLITS if args.split == "all" else (args.split,)
    result, triples = evaluate(
        args.policy,
        splits,
        args.episodes,
        args.seed,
        args.workers,
        checkpoint=args.checkpoint,
        image_dir=out.with_name(out.stem + "_images"),
        config=run_config(args),
        assets=args.assets,
        split_file=args.split_file,
        protocol=args.protocol,
        job_timeout_s=job_timeout,
        views=manip_views(args),
    )
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["grid"] = None
    write_results(out, result)  # the results first: the optional grid below may fail
    print(success_table(result), end="")
    try:
        grid = render_grid(triples, out.with_suffix(".png"))
    except Exception as err:  # an optional picture; the results are already written
        grid, note = None, f" (no grid: rendering it failed: {type(err).__name__}: {err})"
    else:
        note = "" if grid else " (no grid: rendering unavailable)"
    if grid:
        result["grid"] = str(grid)
        write_results(out, result)
    print(f"wrote {out}, {out.with_suffix('.md')}" + (f", {grid}" if grid else note))
    return 0


def write_results(out: Path, result: dict) -> None:
    """The result JSON at ``out`` and its Markdown table beside it (``.md``), each replaced whole (a failed
    write leaves the previous file, never half of one)."""
    for path, text in ((out, json.dumps(result, indent=2)), (out.with_suffix(".md"), success_table(result))):
        partial = path.with_name(f".{path.name}.partial")
        try:
            partial.write_text(text)
            os.replace(partial, path)
        except OSError as err:
            partial.unlink(missing_ok=True)
            raise StorageError(f"--out {out}: cannot write the results ({err.strerror or err})") from None
