"""benchmarks/compare.py's argument handling: refusals that protect the user's files and say what to do."""

from __future__ import annotations

from comparison.main import main


def test_refuses_an_out_folder_it_did_not_make(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["--quick", "--out", str(tmp_path)]) == 1
    assert "holds files this script did not make" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_report_only_needs_finished_runs(tmp_path, capsys):
    assert main(["--quick", "--report-only", "--out", str(tmp_path / "fresh"), "--docs", str(tmp_path)]) == 1
    assert "--report-only needs finished runs; not finished: model" in capsys.readouterr().err


def test_bad_selection_is_one_line(tmp_path, capsys):
    assert main(["--tasks", "juggling", "--out", str(tmp_path / "x")]) == 2
    assert "unknown task 'juggling'" in capsys.readouterr().err
    assert main(["--arms", "T1A1", "--out", str(tmp_path / "x")]) == 2
    assert main(["--workers", "0", "--out", str(tmp_path / "x")]) == 2
