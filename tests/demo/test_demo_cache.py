"""Demo cache entries are reused only when complete and built from the same inputs."""

import pytest

from vlm_grpoma.demo import cache
from vlm_grpoma.demo.cache import CacheEntry, source_digest


def test_an_entry_is_reused_only_after_it_finished(tmp_path):
    entry = CacheEntry(tmp_path, "data", {"train_records": 1500, "seed": 0})
    assert entry.built_seconds() is None
    folder = entry.start()
    (folder / "records.jsonl").write_text("{}\n")
    assert entry.built_seconds() is None  # interrupted here: not reusable
    entry.finish(12.5)
    assert CacheEntry(tmp_path, "data", {"seed": 0, "train_records": 1500}).built_seconds() == 12.5


def test_changed_inputs_are_a_different_entry_and_building_it_removes_the_stale_one(tmp_path):
    old = CacheEntry(tmp_path, "data", {"train_records": 1500, "seed": 0})
    old.start()
    old.finish(1.0)
    new = CacheEntry(tmp_path, "data", {"train_records": 1000, "seed": 0})
    other_kind = CacheEntry(tmp_path, "warm-start", {"data": old.key})
    other_kind.start()
    assert new.key != old.key and new.built_seconds() is None
    new.start()
    assert not old.path.exists() and new.path.is_dir() and other_kind.path.is_dir()


def test_a_marker_from_other_inputs_is_not_trusted(tmp_path):
    entry = CacheEntry(tmp_path, "data", {"seed": 0})
    entry.start()
    entry.finish(1.0)
    impostor = CacheEntry(tmp_path, "data", {"seed": 1})
    entry.path.rename(impostor.path)  # same folder name as seed 1 would use, but built from seed 0
    assert impostor.built_seconds() is None


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "pkg"
    (root / "envs").mkdir(parents=True)
    (root / "envs" / "scene.py").write_text("A = 1\n")
    (root / "answers.py").write_text("B = 2\n")
    (root / "trainer.py").write_text("C = 3\n")
    monkeypatch.setattr(cache, "PACKAGE", root)
    return root


def test_source_digest_follows_exactly_the_named_code(package):
    before = source_digest(["envs", "answers.py"])
    (package / "trainer.py").write_text("C = 4\n")
    assert source_digest(["envs", "answers.py"]) == before  # not part of it
    (package / "envs" / "scene.py").write_text("A = 2\n")
    changed = source_digest(["envs", "answers.py"])
    assert changed != before
    (package / "envs" / "scene.py").rename(package / "envs" / "scene2.py")
    assert source_digest(["envs", "answers.py"]) != changed  # a renamed file counts too
    assert source_digest(["."]) != source_digest(["envs", "answers.py"])


def test_a_changed_plan_rebuilds_what_it_changes_and_nothing_else(tmp_path):
    from dataclasses import replace

    from vlm_grpoma.demo.manipulation import ManipulationPlan, data_entry, warm_start_entry

    plan = ManipulationPlan()
    data = data_entry(tmp_path, plan, seed=0)
    warm = warm_start_entry(tmp_path, plan, 0, data)
    longer_sft = replace(plan, sft_steps=400)
    assert data_entry(tmp_path, longer_sft, 0).key == data.key  # the renders are still valid
    assert warm_start_entry(tmp_path, longer_sft, 0, data).key != warm.key
    fewer_records = replace(plan, train_records=1000)
    new_data = data_entry(tmp_path, fewer_records, 0)
    assert new_data.key != data.key
    assert warm_start_entry(tmp_path, fewer_records, 0, new_data).key != warm.key  # trained on other data
    assert data_entry(tmp_path, plan, seed=1).key != data.key
    # GRPO is not cached
    assert warm_start_entry(tmp_path, replace(plan, grpo_steps=10), 0, data).key == warm.key
