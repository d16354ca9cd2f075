"""The command runner with real (cheap) ``vlm-grpoma make-data`` commands: order, reuse, reruns, failures."""

from __future__ import annotations

import pytest
from comparison.jobs import MARKER, Job, JobFailed, run_jobs


def _make_data(name: str, out, n: int = 2, after: tuple[str, ...] = ()) -> Job:
    return Job(
        name,
        (
            "make-data",
            "--task",
            "detection",
            "--source",
            "shapes",
            "--n",
            str(n),
            "--difficulty",
            "easy",
            "--out",
            str(out),
        ),
        out,
        after,
    )


def test_runs_in_dependency_order_then_reuses_finished_jobs_and_reruns_changed_ones(tmp_path):
    first, second = (
        _make_data("first", tmp_path / "a"),
        _make_data("second", tmp_path / "b", after=("first",)),
    )
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "stale.txt").write_text("left by an interrupted run")
    said: list[str] = []
    timings = run_jobs([second, first], workers=2, log_dir=tmp_path / "logs", report=said.append)
    assert set(timings) == {"first", "second"} and all(t.seconds > 0 for t in timings.values())
    assert timings["second"].started_at >= timings["first"].finished_at
    assert said.index("[compare] second: started (1/2 done)") > next(
        i for i, m in enumerate(said) if m.startswith("[compare] first: finished")
    )
    assert not (tmp_path / "b" / "stale.txt").exists()
    assert len((tmp_path / "b" / "records.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "a" / MARKER).is_file() and first.finished() == timings["first"]

    said.clear()
    again = run_jobs([first, second], workers=1, log_dir=tmp_path / "logs", report=said.append)
    assert again == timings and all("done earlier" in m for m in said)

    changed = _make_data("second", tmp_path / "b", n=3, after=("first",))
    assert changed.finished() is None  # the marker holds the old command
    said.clear()
    run_jobs([first, changed], workers=1, log_dir=tmp_path / "logs", report=said.append)
    assert (
        said[0].startswith("[compare] first: done earlier") and "[compare] second: started (1/2 done)" in said
    )
    assert len((tmp_path / "b" / "records.jsonl").read_text().splitlines()) == 3

    (tmp_path / "a" / MARKER).unlink()  # the upstream job is rebuilt: what waited for it must be rebuilt too
    said.clear()
    run_jobs([first, changed], workers=1, log_dir=tmp_path / "logs", report=said.append)
    assert [m.split(":")[0] for m in said if "started" in m] == ["[compare] first", "[compare] second"]


def test_a_failing_command_stops_the_graph_with_its_command_and_log(tmp_path):
    bad = Job(
        "bad",
        ("make-data", "--task", "juggling", "--source", "shapes", "--n", "1", "--out", str(tmp_path / "bad")),
        tmp_path / "bad",
    )
    never = _make_data("never", tmp_path / "never", after=("bad",))
    with pytest.raises(
        JobFailed,
        match=r"(?s)bad failed \(exit 2\): vlm-grpoma make-data --task juggling.*"
        r"invalid choice: 'juggling'",
    ):
        run_jobs([bad, never], workers=2, log_dir=tmp_path / "logs", report=lambda _: None)
    assert not (tmp_path / "never").exists() and not (tmp_path / "bad" / MARKER).exists()


def test_graph_errors_are_caught_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="unknown jobs: \\['ghost'\\]"):
        run_jobs([_make_data("a", tmp_path / "a", after=("ghost",))], workers=1, log_dir=tmp_path)
    with pytest.raises(ValueError, match="unique"):
        run_jobs(
            [_make_data("a", tmp_path / "a"), _make_data("a", tmp_path / "b")], workers=1, log_dir=tmp_path
        )


def test_a_job_wanting_every_core_runs_alone_and_a_script_job_runs_with_this_python(tmp_path):
    wide = Job("wide", _make_data("x", tmp_path / "wide").args, tmp_path / "wide", threads=8)
    narrow = _make_data("narrow", tmp_path / "narrow")
    script = Job("script", ("--help",), tmp_path / "script", script="benchmarks/thought_matters.py")
    timings = run_jobs([wide, narrow, script], workers=2, log_dir=tmp_path / "logs", report=lambda _: None)
    assert timings["narrow"].started_at >= timings["wide"].finished_at
    assert timings["script"].started_at >= timings["wide"].finished_at
    assert "Does the thought decide?" in (tmp_path / "logs" / "script.log").read_text()
    assert script.command() == "python benchmarks/thought_matters.py --help"
