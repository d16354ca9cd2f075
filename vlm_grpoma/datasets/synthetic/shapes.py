"""Seeded synthetic scenes of coloured shapes with exact ground truth, for detection, affordance, trajectory.

Every shape is drawn (without anti-aliasing) through its own binary mask (:mod:`.canvas`), so a box is the
exact pixel extent of what was drawn (``[x1, y1, x2, y2]`` with exclusive ``x2, y2``: pixel ``i`` covers
``[i, i+1)``), shapes never overlap, and a part mask is exactly the pixels of that part. Shape colours are
saturated (one channel <= 50) and backgrounds are pale (every channel >= 90), so no background pixel has a
shape's colour. Same seed -> byte-identical images, masks and records.jsonl.

- detection: "Find the large red triangle left of the blue circle." (a unique expression; the generator
  adds same-colour/same-kind distractors so size and spatial relations are often needed), or
  "Find all the green shapes." with one box per member. ``difficulty="relational"``: 3-6 shapes and a prompt
  that needs all of them ("the largest red shape"), with a reference thought that enumerates the objects and
  decides (:mod:`~vlm_grpoma.datasets.synthetic.relational`).
- affordance: tools made of parts (a mug = body + handle, a pan = head + handle); "Point to the handle of
  the red mug."; ground truth is a mask PNG of that part.
- trajectory: "Draw a path from the red circle to the blue square around the green triangle."; the
  ground-truth polyline start -> two detour corners -> goal keeps a clearance disc around the obstacle by
  construction (see :func:`_detour`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from vlm_grpoma.answers import Box, Boxes, Trajectory
from vlm_grpoma.datasets.jsonl import write_records
from vlm_grpoma.datasets.schema import MaskRef, Record
from vlm_grpoma.datasets.synthetic.canvas import ATTEMPTS, COLOURS, DrawnObject, Scene, canvas_mask, mask_box
from vlm_grpoma.datasets.synthetic.relational import SceneObject, choose, thought_text

SHAPES: tuple[str, ...] = ("square", "rectangle", "circle", "triangle", "diamond", "hexagon")
TOOLS: dict[str, tuple[str, ...]] = {"mug": ("handle", "body"), "pan": ("handle", "head")}
BACKGROUNDS: tuple[str, ...] = ("solid", "gradient", "noise")
DIFFICULTIES: tuple[str, ...] = ("easy", "normal", "relational")
SHAPE_TASKS: tuple[str, ...] = ("detection", "affordance", "trajectory")
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
_CLEARANCE = 3.0  # trajectory: extra pixels between the path and the obstacle's bounding disc


@dataclass(frozen=True)
class ShapesConfig:
    """How scenes look. ``difficulty="easy"`` names targets by colour + kind only ("Find the red square.")."""

    image_size: int = 224
    min_distractors: int = 1
    max_distractors: int = 4
    min_shape_size: int = 20
    max_shape_size: int = 56
    difficulty: str = "normal"
    shapes: tuple[str, ...] = SHAPES
    colours: tuple[str, ...] = tuple(COLOURS)
    backgrounds: tuple[str, ...] = BACKGROUNDS
    multi_fraction: float = 0.25  # detection: share of "Find all the ..." multi-box records

    def validate(self) -> None:
        problems = []
        if self.image_size < 64:
            problems.append(f"image_size must be >= 64, got {self.image_size}")
        if not 8 <= self.min_shape_size <= self.max_shape_size <= self.image_size // 2:
            problems.append(
                "need 8 <= min_shape_size <= max_shape_size <= image_size / 2, got "
                f"{self.min_shape_size}, {self.max_shape_size}, {self.image_size}"
            )
        if not 0 <= self.min_distractors <= self.max_distractors <= 8:
            problems.append(
                "need 0 <= min_distractors <= max_distractors <= 8, got "
                f"{self.min_distractors}, {self.max_distractors}"
            )
        if self.difficulty not in DIFFICULTIES:
            problems.append(f"difficulty must be one of {DIFFICULTIES}, got {self.difficulty!r}")
        for name, values, known in (
            ("shapes", self.shapes, SHAPES),
            ("colours", self.colours, tuple(COLOURS)),
            ("backgrounds", self.backgrounds, BACKGROUNDS),
        ):
            unknown = [v for v in values if v not in known]
            if not values or unknown:
                problems.append(f"{name} must be a non-empty subset of {known}, got {values}")
        if not 0.0 <= self.multi_fraction <= 1.0:
            problems.append(f"multi_fraction must be in [0, 1], got {self.multi_fraction}")
        if problems:
            raise ValueError("ShapesConfig: " + "; ".join(problems))


#: The CPU preset (``--difficulty easy``, the data of docs/results.md): 112x112, one or two shapes,
#: "Find the red square.".
EASY = ShapesConfig(
    image_size=112,
    min_distractors=0,
    max_distractors=1,
    min_shape_size=16,
    max_shape_size=48,
    difficulty="easy",
    shapes=("square", "circle"),
    backgrounds=("solid",),
    multi_fraction=0.0,
)
#: Relational detection (GRPO-MA's regime: a long thought that decides, a short answer): 112x112, 3-6 shapes
#: of 3 colours and 3 kinds, unlabelled target box.
RELATIONAL = ShapesConfig(
    image_size=112,
    min_distractors=2,
    max_distractors=5,
    min_shape_size=14,
    max_shape_size=36,
    difficulty="relational",
    shapes=("square", "circle", "triangle"),
    colours=("red", "green", "blue"),
    backgrounds=("solid",),
    multi_fraction=0.0,
)
PRESETS: dict[str, ShapesConfig] = {"easy": EASY, "normal": ShapesConfig(), "relational": RELATIONAL}


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


# ---------------------------------------------------------------------------------------------- language


def _relation_holds(rel: str, a: DrawnObject, b: DrawnObject) -> bool:
    """``a`` is <rel> ``b``: strictly, i.e. the boxes do not overlap along that axis."""
    ax0, ay0, ax1, ay1 = a.box
    bx0, by0, bx1, by1 = b.box
    return {"left of": ax1 <= bx0, "right of": ax0 >= bx1, "above": ay1 <= by0, "below": ay0 >= by1}[rel]


def _basic_description(obj: DrawnObject, objects: list[DrawnObject], use_size: bool) -> str | None:
    """ "the red circle" or "the large red circle" if that identifies ``obj`` uniquely, else None."""
    if not [o for o in objects if o is not obj and o.name == obj.name]:
        return f"the {obj.name}"
    same = [o for o in objects if o is not obj and o.name == obj.name and o.size == obj.size]
    if use_size and obj.size and not same:
        return f"the {obj.size} {obj.name}"
    return None


def _referring_expression(
    rng: np.random.Generator, target: DrawnObject, objects: list[DrawnObject], easy: bool
) -> str | None:
    """An expression that picks out only ``target``, or None: the plain one ("the [size] colour kind") when
    unique, though 30 % of the time a relational one ("... left of the blue circle") instead if one exists."""
    basic = _basic_description(target, objects, use_size=not easy)
    if easy:
        return basic
    relational = []
    rivals = [o for o in objects if o is not target and o.name == target.name]
    for ref in objects:
        ref_desc = _basic_description(ref, objects, use_size=True) if ref is not target else None
        if ref_desc is None or ref.name == target.name:
            continue
        for rel in RELATIONS:
            if _relation_holds(rel, target, ref) and not any(_relation_holds(rel, o, ref) for o in rivals):
                head = basic if basic is not None else f"the {target.name}"
                relational.append(f"{head} {rel} {ref_desc}")
    if basic is not None and (not relational or rng.random() < 0.7):
        return basic
    return _pick(rng, relational) if relational else None


# ---------------------------------------------------------------------------------------------- scenes


def _size(rng: np.random.Generator, cfg: ShapesConfig, size_cls: str, cap: int | None = None) -> int:
    lo, hi = cfg.min_shape_size, min(cfg.max_shape_size, cap or cfg.max_shape_size)
    if size_cls == "small":
        hi = lo + int(0.4 * (hi - lo))
    elif size_cls == "large":
        lo = lo + math.ceil(0.6 * (hi - lo))
    return int(rng.integers(lo, hi + 1))


def _size_class(rng: np.random.Generator, cfg: ShapesConfig) -> str:
    return "" if cfg.difficulty == "easy" else _pick(rng, ("small", "large"))


def _add_distractors(rng, scene: Scene, cfg: ShapesConfig, count: int, avoid: set[str] = frozenset()) -> None:
    for _ in range(count):
        kind, colour = _pick(rng, cfg.shapes), _pick(rng, cfg.colours)
        if f"{colour} {kind}" in avoid:
            continue
        size_cls = _size_class(rng, cfg)
        scene.add_shape(rng, kind, colour, size_cls, _size(rng, cfg, size_cls))


def _detection(rng, cfg: ShapesConfig, scene: Scene) -> tuple[str, list[DrawnObject], dict] | None:
    n_distractors = int(rng.integers(cfg.min_distractors, cfg.max_distractors + 1))
    if rng.random() < cfg.multi_fraction:
        by_colour = bool(rng.integers(2))
        key = _pick(rng, cfg.colours) if by_colour else _pick(rng, cfg.shapes)
        for _ in range(int(rng.integers(2, 4))):
            kind = _pick(rng, cfg.shapes) if by_colour else key
            colour = key if by_colour else _pick(rng, cfg.colours)
            size_cls = _size_class(rng, cfg)
            scene.add_shape(rng, kind, colour, size_cls, _size(rng, cfg, size_cls))
        _add_distractors(rng, scene, cfg, max(1, n_distractors))
        members = [o for o in scene.objects if (o.colour if by_colour else o.kind) == key]
        if len(members) < 2 or len(members) == len(scene.objects):
            return None
        expr = f"all the {key} shapes" if by_colour else f"all the {key}s"
        return f"Find {expr}.", members, {"expression": expr, "group_by": "colour" if by_colour else "kind"}
    kind, colour, size_cls = _pick(rng, cfg.shapes), _pick(rng, cfg.colours), _size_class(rng, cfg)
    target = scene.add_shape(rng, kind, colour, size_cls, _size(rng, cfg, size_cls))
    if target is None:
        return None
    if cfg.difficulty != "easy" and n_distractors and rng.random() < 0.6:  # a twin that forces size/relation
        twin_cls = _pick(rng, ("small", "large"))
        scene.add_shape(rng, kind, colour, twin_cls, _size(rng, cfg, twin_cls))
        n_distractors -= 1
    _add_distractors(
        rng, scene, cfg, n_distractors, avoid={target.name} if cfg.difficulty == "easy" else set()
    )
    expr = _referring_expression(rng, target, scene.objects, easy=cfg.difficulty == "easy")
    if expr is None:
        return None
    return f"Find {expr}.", [target], {"expression": expr}


def _relational(rng, cfg: ShapesConfig, scene: Scene) -> tuple[str, list[DrawnObject], dict] | None:
    """3-6 shapes, one named by a relational expression, and the reference thought that finds it."""
    for _ in range(int(rng.integers(cfg.min_distractors, cfg.max_distractors + 1)) + 1):
        size_cls = _pick(rng, ("small", "large"))
        scene.add_shape(
            rng, _pick(rng, cfg.shapes), _pick(rng, cfg.colours), size_cls, _size(rng, cfg, size_cls)
        )
    if len(scene.objects) < 3:
        return None
    seen = [SceneObject(o.kind, o.colour, o.size, o.box, int(o.mask.sum())) for o in scene.objects]
    if len({o.describe(cfg.image_size) for o in seen}) < len(seen):
        return None  # two shapes the thought would describe alike: its conclusion would not say which one
    choice = choose(rng, seen)
    if choice is None:
        return None
    meta = {
        "expression": choice.expression,
        "thought": thought_text(seen, choice, cfg.image_size),
        "choice": dataclasses.asdict(choice),
    }
    return f"Find {choice.expression}.", [scene.objects[choice.index]], meta


def _affordance(rng, cfg: ShapesConfig, scene: Scene) -> tuple[str, DrawnObject, str, dict] | None:
    kind, colour = _pick(rng, tuple(TOOLS)), _pick(rng, cfg.colours)
    part = _pick(rng, TOOLS[kind])
    cap = int(cfg.image_size * 0.45)
    s = _size(rng, cfg, "", cap=cap)
    target = scene.add_tool(rng, kind, colour, max(s, 24))
    if target is None:
        return None
    if int(rng.integers(cfg.max_distractors + 1)) > 0:  # another tool, named differently
        other_kind, other_colour = _pick(rng, tuple(TOOLS)), _pick(rng, cfg.colours)
        if f"{other_colour} {other_kind}" != target.name:
            scene.add_tool(rng, other_kind, other_colour, max(_size(rng, cfg, "", cap=cap), 24))
    _add_distractors(rng, scene, cfg, int(rng.integers(cfg.min_distractors, cfg.max_distractors + 1)))
    expr = f"the {part} of the {target.name}"
    return (
        f"Point to {expr}.",
        target,
        part,
        {"expression": expr, "part": part, "part_box": list(mask_box(target.parts[part]))},
    )


def _detour(
    start: np.ndarray,
    goal: np.ndarray,
    centre: np.ndarray,
    radius: float,
    size: int,
    rng: np.random.Generator,
) -> list[tuple[float, float]] | None:
    """start -> two corners -> goal, every segment at least ``radius`` from ``centre``, inside the image.

    In coordinates along u = (goal - start)/|goal - start| and its normal n, with the centre at (a, e):
    the corners are (a - R, e ± R') and (a + R, e ± R') with R' > R. The first segment has along-coordinate
    <= a - R, the last >= a + R, and the middle one lies at normal distance R' from the centre, so all
    three keep at least R from it, provided R <= a <= L - R (checked).
    """
    length = float(np.linalg.norm(goal - start))
    u = (goal - start) / length
    n = np.array([-u[1], u[0]])
    a, e = float((centre - start) @ u), float((centre - start) @ n)
    if not radius <= a <= length - radius:
        return None
    sides = []
    for sign in (1.0, -1.0):
        h = e + sign * (radius + 1.0)  # 1 px beyond R absorbs rounding to 0.1 px
        corners = [start + (a - radius) * u + h * n, start + (a + radius) * u + h * n]
        if all(1 <= c[0] <= size - 1 and 1 <= c[1] <= size - 1 for c in corners):
            sides.append(corners)
    if not sides:
        return None
    corners = _pick(rng, sides)
    return [(round(float(p[0]), 1), round(float(p[1]), 1)) for p in (start, *corners, goal)]


def _centre(box: tuple[int, int, int, int]) -> np.ndarray:
    return np.array([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2])


def _trajectory(rng, cfg: ShapesConfig, scene: Scene) -> tuple[str, list[tuple[float, float]], dict] | None:
    cap = cfg.image_size // 5
    names = [(k, c) for k in cfg.shapes for c in cfg.colours]
    picks = rng.permutation(len(names))[:3]
    if len(picks) < 3:
        return None
    (sk, sc), (gk, gc), (ok, oc) = (names[i] for i in picks)
    s_obs = _size(rng, cfg, "", cap=cap)
    margin = cfg.image_size * 0.3
    obstacle = scene.add_shape(
        rng, ok, oc, "", s_obs, centre=tuple(rng.uniform(margin, cfg.image_size - margin, 2))
    )
    if obstacle is None:
        return None
    c = _centre(obstacle.box)
    radius = math.hypot(obstacle.box[2] - obstacle.box[0], obstacle.box[3] - obstacle.box[1]) / 2 + _CLEARANCE
    angle = rng.uniform(0, 2 * math.pi)
    u, n = np.array([math.cos(angle), math.sin(angle)]), np.array([-math.sin(angle), math.cos(angle)])
    ends = []
    for kind, colour, sign in ((sk, sc, -1.0), (gk, gc, 1.0)):
        s = _size(rng, cfg, "", cap=cap)
        dist = radius + s * 0.75 + rng.uniform(2, 12)
        # the straight line hits the obstacle
        centre = c + sign * dist * u + rng.uniform(-0.08, 0.08) * s_obs * n
        ends.append(scene.add_shape(rng, kind, colour, "", s, centre=tuple(centre)))
    if None in ends:
        return None
    path = _detour(_centre(ends[0].box), _centre(ends[1].box), c, radius, cfg.image_size, rng)
    if path is None:
        return None
    scene.keepout = canvas_mask((cfg.image_size, cfg.image_size), lambda d: d.line(path, fill=255, width=3))
    _add_distractors(
        rng,
        scene,
        cfg,
        int(rng.integers(cfg.min_distractors, cfg.max_distractors + 1)),
        avoid={o.name for o in scene.objects},
    )
    expr = f"a path from the {ends[0].name} to the {ends[1].name} around the {obstacle.name}"
    meta = {
        "expression": expr,
        "start": 1,
        "goal": 2,
        "obstacle": 0,
        "clearance_disc": [round(float(c[0]), 3), round(float(c[1]), 3), round(radius, 3)],
    }
    return f"Draw {expr}.", path, meta


# ---------------------------------------------------------------------------------------------- records


def make_record(task: str, index: int, out_dir: Path, seed: int, split: str, cfg: ShapesConfig) -> Record:
    """Draw scene ``index`` of a seeded dataset, write its image (and mask), and return its Record."""
    rng = np.random.default_rng([seed, index, SHAPE_TASKS.index(task)])
    stem = f"{split}-{index:06d}"
    for _ in range(ATTEMPTS):
        scene = Scene(cfg.image_size)
        background = _pick(rng, cfg.backgrounds)
        meta: dict = {"source": "shapes", "difficulty": cfg.difficulty, "background": background}
        if task == "detection":
            made = (_relational if cfg.difficulty == "relational" else _detection)(rng, cfg, scene)
            if made is None:
                continue
            prompt, targets, extra = made
            ordered = sorted(targets, key=lambda o: o.box)
            # the relational thought names it; the answer stays short
            labelled = cfg.difficulty != "relational"
            gt = Boxes(tuple(Box(*o.box, label=o.name if labelled else "") for o in ordered))
            extra["targets"] = [scene.objects.index(o) for o in ordered]
        elif task == "affordance":
            made = _affordance(rng, cfg, scene)
            if made is None:
                continue
            prompt, tool, part, extra = made
            mask_path = out_dir / "masks" / f"{stem}.png"
            mask_path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(tool.parts[part].astype(np.uint8) * 255, "L").save(mask_path, format="PNG")
            gt, extra["target"] = MaskRef(str(mask_path)), scene.objects.index(tool)
        elif task == "trajectory":
            made = _trajectory(rng, cfg, scene)
            if made is None:
                continue
            prompt, path, extra = made
            gt = Trajectory(tuple(path))
        else:
            raise ValueError(f"the shapes source has no {task!r} task; choose one of {SHAPE_TASKS}")
        image_path = out_dir / "images" / f"{stem}.png"
        image_path.parent.mkdir(parents=True, exist_ok=True)
        scene.render(rng, background).save(image_path, format="PNG")
        meta.update(extra, objects=[o.to_json() for o in scene.objects])
        return Record(
            id=f"shapes-{task}-{stem}",
            image=str(image_path),
            task=task,
            prompt=prompt,  # type: ignore[arg-type]
            width=cfg.image_size,
            height=cfg.image_size,
            ground_truth=gt,
            split=split,
            meta=meta,
        )
    raise ValueError(
        f"could not build a {task} scene in {ATTEMPTS} attempts; the ShapesConfig is too restrictive: {cfg}"
    )


def generate_shapes(
    task: str,
    n: int,
    out_dir: str | Path,
    seed: int = 0,
    split: str = "train",
    config: ShapesConfig | None = None,
) -> Path:
    """Write ``n`` records of ``task`` with images/ (and masks/) under ``out_dir``; returns records.jsonl."""
    cfg = config or ShapesConfig()
    cfg.validate()
    if task not in SHAPE_TASKS:
        raise ValueError(f"the shapes source has no {task!r} task; choose one of {SHAPE_TASKS}")
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    out = Path(out_dir).absolute()
    records = [make_record(task, i, out, seed, split, cfg) for i in range(n)]
    return write_records(out / "records.jsonl", records)


__all__ = [
    "COLOURS",
    "EASY",
    "PRESETS",
    "RELATIONAL",
    "SHAPES",
    "SHAPE_TASKS",
    "TOOLS",
    "ShapesConfig",
    "generate_shapes",
    "make_record",
]
