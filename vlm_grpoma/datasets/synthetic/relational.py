"""Relational shapes detection: a thought that decides which object the answer boxes.

Scenes hold 3-6 shapes of few colours and kinds; the prompt picks one by a relation that needs every object in
view ("the largest red shape", "the leftmost circle", "the second square from the top", "the shape left of the
blue circle"). Each record carries a reference thought (``meta["thought"]``) that enumerates the objects in
reading order with coarse positions, then names the chosen one; the answer is that object's box, unlabelled
(short). The thought is several times longer than the answer and carries the decision — the regime in which
GRPO-MA's M answers per thought estimate the value of a thought. ``meta["choice"]`` holds the chosen object's index
in ``meta["objects"]``, the ranked candidates and the ranking phrase, so :func:`thought_text` can rebuild the
thought with a wrong conclusion (used to show that the thought matters).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROWS = ("top", "middle", "bottom")
COLUMNS = ("left", "centre", "right")
#: A size relation needs this ratio between the areas of the first and second candidate.
AREA_RATIO = 1.4
#: A position relation (leftmost, second from the top, left of) needs this many pixels between candidates.
POSITION_GAP = 6


@dataclass(frozen=True)
class SceneObject:
    """One drawn shape as the language layer sees it."""

    kind: str
    colour: str
    size: str  # "small" | "large"
    box: tuple[int, int, int, int]
    area: int

    @property
    def centre(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2

    def place(self, image_size: int) -> str:
        """Coarse position in thirds of the image: "at the top left", "in the middle right", "in the centre"."""
        x, y = self.centre
        row = ROWS[min(2, int(3 * y / image_size))]
        column = COLUMNS[min(2, int(3 * x / image_size))]
        if (row, column) == ("middle", "centre"):
            return "in the centre"
        return f"{'in' if row == 'middle' else 'at'} the {row} {column}"

    def describe(self, image_size: int) -> str:
        return f"the {self.size} {self.colour} {self.kind} {self.place(image_size)}"


@dataclass(frozen=True)
class Choice:
    """A relational expression, the object it names, and the reasoning step that finds it: the candidates
    (in the order the relation ranks them) and how they are ranked."""

    expression: str
    index: int
    candidates: tuple[int, ...]
    ranking: str  # "The red shapes, largest first:" — followed by the candidates


def reading_order(objects: list[SceneObject], image_size: int) -> list[int]:
    """Indices of ``objects`` by row third, then left to right: the order a thought lists them in."""
    return sorted(
        range(len(objects)), key=lambda i: (int(3 * objects[i].centre[1] / image_size), objects[i].centre[0])
    )


def thought_text(
    objects: list[SceneObject], choice: Choice, image_size: int, chosen: int | None = None
) -> str:
    """The reference thought: every object in reading order, the candidates ranked, the chosen one.

    ``chosen`` replaces the correct object in the conclusion (a wrong thought, for showing the thought matters).
    """
    listed = ", ".join(objects[i].describe(image_size) for i in reading_order(objects, image_size))
    ranked = ", ".join(objects[i].describe(image_size) for i in choice.candidates)
    pick = choice.index if chosen is None else chosen
    return (
        f"I see {len(objects)} shapes: {listed}. {choice.ranking} {ranked}. "
        f"{choice.expression[0].upper()}{choice.expression[1:]} is {objects[pick].describe(image_size)}."
    )


# ---------------------------------------------------------------------------------------------- relations


def _group(objects: list[SceneObject], key: str, value: str) -> list[int]:
    return [i for i, o in enumerate(objects) if getattr(o, key) == value]


def _plural(key: str, value: str) -> str:
    return f"{value} shapes" if key == "colour" else f"{value}s"


def _singular(key: str, value: str) -> str:
    return f"{value} shape" if key == "colour" else value


def _ranked(values: dict[int, float], *, by_ratio: bool) -> list[int] | None:
    """Indices by ascending value when neighbours differ clearly (by AREA_RATIO or POSITION_GAP), else None."""
    order = sorted(values, key=values.get)
    for a, b in zip(order, order[1:]):
        low, high = values[a], values[b]
        if (high < AREA_RATIO * low) if by_ratio else (high - low < POSITION_GAP):
            return None
    return order


def _groups(objects: list[SceneObject], least: int):
    """(key, value, members) for every colour and kind shared by at least ``least`` objects."""
    for key in ("colour", "kind"):
        for value in sorted({getattr(o, key) for o in objects}):
            members = _group(objects, key, value)
            if len(members) >= least:
                yield key, value, members


def superlatives(objects: list[SceneObject]) -> list[Choice]:
    """ "the largest/smallest red shape", "the leftmost/rightmost/topmost/bottom-most circle"."""
    found = []
    for key, value, members in _groups(objects, 2):
        plural, single = _plural(key, value), _singular(key, value)
        by_area = _ranked({i: objects[i].area for i in members}, by_ratio=True)
        if by_area:
            big = tuple(reversed(by_area))
            found.append(Choice(f"the largest {single}", big[0], big, f"The {plural}, largest first:"))
            found.append(
                Choice(f"the smallest {single}", by_area[0], tuple(by_area), f"The {plural}, smallest first:")
            )
        for axis, (low, high), (first, last) in (
            (0, ("leftmost", "rightmost"), ("left", "right")),
            (1, ("topmost", "bottom-most"), ("top", "bottom")),
        ):
            order = _ranked({i: objects[i].centre[axis] for i in members}, by_ratio=False)
            if order:
                found.append(
                    Choice(f"the {low} {single}", order[0], tuple(order), f"The {plural} from the {first}:")
                )
                back = tuple(reversed(order))
                found.append(Choice(f"the {high} {single}", back[0], back, f"The {plural} from the {last}:"))
    return found


def ordinals(objects: list[SceneObject]) -> list[Choice]:
    """ "the second circle from the left" in groups of 3 or more."""
    found = []
    for key, value, members in _groups(objects, 3):
        for axis, side in ((0, "left"), (1, "top")):
            order = _ranked({i: objects[i].centre[axis] for i in members}, by_ratio=False)
            if order:
                found.append(
                    Choice(
                        f"the second {_singular(key, value)} from the {side}",
                        order[1],
                        tuple(order),
                        f"The {_plural(key, value)} from the {side}:",
                    )
                )
    return found


def _strictly(relation: str, a: SceneObject, b: SceneObject) -> bool:
    ax0, ay0, ax1, ay1 = a.box
    bx0, by0, bx1, by1 = b.box
    gap = POSITION_GAP
    return {
        "left of": ax1 + gap <= bx0,
        "right of": ax0 >= bx1 + gap,
        "above": ay1 + gap <= by0,
        "below": ay0 >= by1 + gap,
    }[relation]


def relations(objects: list[SceneObject]) -> list[Choice]:
    """ "the shape left of the blue circle" when exactly one shape qualifies."""
    found = []
    for r, ref in enumerate(objects):
        if sum(o.colour == ref.colour and o.kind == ref.kind for o in objects) > 1:
            continue  # the reference itself must be unique by colour and kind
        for relation in ("left of", "right of", "above", "below"):
            hits = [i for i, o in enumerate(objects) if i != r and _strictly(relation, o, ref)]
            if len(hits) == 1:
                name = f"the {ref.colour} {ref.kind}"
                found.append(
                    Choice(
                        f"the shape {relation} {name}",
                        hits[0],
                        (hits[0],),
                        f"{name.capitalize()} has {relation} it:",
                    )
                )
    return found


def choose(rng: np.random.Generator, objects: list[SceneObject]) -> Choice | None:
    """One relational expression naming exactly one object: a family picked uniformly among those possible."""
    families = [f for f in (superlatives(objects), ordinals(objects), relations(objects)) if f]
    if not families:
        return None
    family = families[int(rng.integers(len(families)))]
    return family[int(rng.integers(len(family)))]
