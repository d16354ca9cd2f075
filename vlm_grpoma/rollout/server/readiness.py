"""Wait until rollout servers answer ``/health``: what the serve-and-train launch layouts run before any rank.

``python -m vlm_grpoma.rollout.server.readiness --timeout-s S [--watch PID=LOG ...] URL ...`` returns 0 once
every URL answers, or exits 2 with one line: a watched process (a server, or the ``srun`` that runs them) that
ended first, with its log's last line, or the URL still silent after ``S`` seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def process_ended(pid: int) -> bool:
    """``pid`` is gone or a zombie (its parent, the launch script, has not reaped it yet; Linux's /proc tells,
    elsewhere only whether it exists)."""
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(no output)"


def answers(url: str) -> bool:
    try:
        with _DIRECT.open(url.rstrip("/") + "/health", timeout=5) as response:
            response.read()
        return True
    except OSError:
        return False


def wait_for_servers(urls: Sequence[str], timeout_s: float, watched: dict[int, Path]) -> str | None:
    """None once every URL answers; else the one-line reason it will not."""
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while not answers(url):
            for pid, log in watched.items():
                if process_ended(pid):
                    return f"rollout server process {pid} exited before serving ({log}): {last_line(log)}"
            if time.monotonic() > deadline:
                return f"rollout server {url} did not answer within {timeout_s:g} s"
            time.sleep(1)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="readiness", description=__doc__.split("\n")[0])
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--watch", action="append", default=[], metavar="PID=LOG")
    parser.add_argument(
        "--prefix", default="", help="the first words of the failure line (the caller's name)"
    )
    parser.add_argument("urls", nargs="+")
    args = parser.parse_args(argv)
    watched = {int(pid): Path(log) for pid, _, log in (item.partition("=") for item in args.watch)}
    problem = wait_for_servers(args.urls, args.timeout_s, watched)
    if problem is not None:
        print(f"{args.prefix}{problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
