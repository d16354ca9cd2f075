"""Seen/unseen category splits of PartNet-Mobility objects, read from a split file (JSON).

The shipped ``manipllm_split.json`` holds ManipLLM's lists (source commit and files inside it). Keys:
``seen`` and ``unseen`` (categories of the two reported aggregates, required), ``train_only`` (trained on,
never reported), ``test_only`` (unseen, never reported), ``test_fraction`` and ``instances`` (``train`` /
``test`` object ids). An object of a seen or train-only category trains or tests by instance: as listed in
``instances``, otherwise by a stable hash of its id that sends ``test_fraction`` of ids to test. Splits of an
object: ``train`` (seen or train-only category, train instance), ``seen`` (seen category, test instance),
``unseen`` (unseen category), or none (a category in no list, or a test instance nobody reports).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from vlm_grpoma.errors import DataError

SPLITS = ("train", "seen", "unseen")
SHIPPED = "manipllm_split.json"


@dataclass(frozen=True)
class CategorySplit:
    name: str
    source: str
    seen: tuple[str, ...]
    unseen: tuple[str, ...]
    train_only: tuple[str, ...] = ()
    test_only: tuple[str, ...] = ()
    test_fraction: float = 0.2
    train_ids: frozenset[str] = frozenset()
    test_ids: frozenset[str] = frozenset()

    def is_test_instance(self, asset_id: str) -> bool:
        if asset_id in self.test_ids:
            return True
        if asset_id in self.train_ids:
            return False
        digest = hashlib.sha256(f"instance:{asset_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.test_fraction

    def split_of(self, asset_id: str, category: str) -> str | None:
        """``train``, ``seen``, ``unseen`` or None (not used) for an object of ``category``."""
        if category in self.unseen:
            return "unseen"
        if category in self.seen:
            return "seen" if self.is_test_instance(asset_id) else "train"
        if category in self.train_only and not self.is_test_instance(asset_id):
            return "train"
        return None

    def categories(self, split: str) -> tuple[str, ...]:
        """Categories whose objects a split draws from, in the file's order."""
        return {"train": self.seen + self.train_only, "seen": self.seen, "unseen": self.unseen}[split]


def _names(data: dict, key: str, path: str, required: bool) -> tuple[str, ...]:
    value = data.get(key, None if required else [])
    if (
        not isinstance(value, list)
        or not all(isinstance(v, str) and v for v in value)
        or (required and not value)
    ):
        raise DataError(f"{path}: {key!r} must be a {'non-empty ' if required else ''}list of category names")
    return tuple(value)


def parse_split(text: str, path: str) -> CategorySplit:
    """A split file's text as a CategorySplit; ``path`` names it in errors."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object with 'seen' and 'unseen' category lists")
    lists = {
        key: _names(data, key, path, key in ("seen", "unseen"))
        for key in ("seen", "unseen", "train_only", "test_only")
    }
    listed = [name for names in lists.values() for name in names]
    twice = sorted({name for name in listed if listed.count(name) > 1})
    if twice:
        raise DataError(f"{path}: categories listed more than once: {', '.join(twice)}")
    fraction = data.get("test_fraction", 0.2)
    if not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise DataError(f"{path}: 'test_fraction' must be a number in [0, 1], got {fraction!r}")
    instances = data.get("instances", {})
    if not isinstance(instances, dict) or not all(
        isinstance(instances.get(k, []), list) for k in ("train", "test")
    ):
        raise DataError(f"{path}: 'instances' must map 'train' and 'test' to lists of object ids")
    train_ids = frozenset(str(i) for i in instances.get("train", []))
    test_ids = frozenset(str(i) for i in instances.get("test", []))
    if train_ids & test_ids:
        raise DataError(f"{path}: object ids in both train and test: {sorted(train_ids & test_ids)[:5]}")
    return CategorySplit(
        str(data.get("name", Path(path).stem)),
        str(data.get("source", path)),
        **lists,
        test_fraction=float(fraction),
        train_ids=train_ids,
        test_ids=test_ids,
    )


def load_split(path: str | Path | None = None) -> CategorySplit:
    """A split file, or ManipLLM's shipped one when ``path`` is None."""
    if path is None:
        return parse_split(resources.files(__package__).joinpath(SHIPPED).read_text(), SHIPPED)
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--split-file {path}: no such file")
    return parse_split(path.read_text(), str(path))


def round_robin(assets: list, split_def: CategorySplit, split: str, count: int) -> list:
    """``count`` objects of a split, one per episode: categories in the split file's order round-robin,
    objects round-robin within a category; empty when the split has no object among ``assets``."""
    by_category: dict[str, list] = {c: [] for c in split_def.categories(split)}
    for asset in assets:
        if split_def.split_of(asset.asset_id, asset.category) == split:
            by_category[asset.category].append(asset)
    groups = [group for group in by_category.values() if group]
    if not groups:
        return []
    return [groups[i % len(groups)][(i // len(groups)) % len(groups[i % len(groups)])] for i in range(count)]


def no_objects_message(assets: list, split_def: CategorySplit, split: str, where: str) -> str:
    """Why ``split`` drew no object from ``assets`` (found in ``where``): how many objects there are and which
    split each falls in (e.g. all training instances of seen categories)."""
    found: dict[str | None, int] = {}
    for asset in assets:
        name = split_def.split_of(asset.asset_id, asset.category)
        found[name] = found.get(name, 0) + 1
    described = {
        "train": "training instances of seen or train-only categories",
        "seen": "test instances of seen categories",
        "unseen": "objects of unseen categories",
        None: "in no split (category unlisted, or a test instance nobody reports)",
    }
    parts = [f"{n} {described[name]}" for name, n in found.items()]
    return (
        f"no {split} objects among the {len(assets)} object(s) found in {where} ({'; '.join(parts)}): "
        f"{split} categories are {', '.join(split_def.categories(split))} ({split_def.name} split)"
    )
