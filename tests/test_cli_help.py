"""``--help`` explains every argument of every command, and cites nothing outside the installed package."""

from __future__ import annotations

import argparse

import pytest

from vlm_grpoma.cli import COMMANDS, build_parser


def subparsers() -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_command_is_listed():
    assert set(subparsers()) == {c.name for c in COMMANDS} >= {"check-data", "convert", "eval", "manip-eval"}


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_every_argument_has_help_and_no_missing_references(name):
    parser = subparsers()[name]
    missing = [a.dest for a in parser._actions if not a.help and not isinstance(a, argparse._HelpAction)]
    assert not missing, f"{name}: arguments without help: {missing}"
    text = parser.format_help() + build_parser().format_help()
    assert "DESIGN.md" not in text and "``" not in text
