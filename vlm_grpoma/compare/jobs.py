"""The comparison as a graph of ``vlm-grpoma`` commands, run a few at a time as separate processes.

Each job is one CLI command (so every number in the report comes from commands a user can paste) with an
output folder and the jobs it waits for. A finished job leaves ``.compare-done`` (its command and seconds) in
that folder; a rerun skips a job whose marker holds the same command and clears a folder that has none
(a run stopped half-way would otherwise append to its metrics).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

MARKER = ".compare-done"
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Job:
    """One ``vlm-grpoma`` command writing into ``out``; runs after every job named in ``after``."""

    name: str
    args: tuple[str, ...]
    out: Path
    after: tuple[str, ...] = ()

    def command(self) -> str:
        """The command line as a user would type it from the repository root."""
        return "vlm-grpoma " + shlex.join(_relative(a) for a in self.args)

    def finished_seconds(self) -> float | None:
        """Seconds the job took when its folder holds this exact command's marker, else None."""
        marker = self.out / MARKER
        if not marker.is_file():
            return None
        done = json.loads(marker.read_text())
        return float(done["seconds"]) if done.get("command") == self.command() else None


def _relative(arg: str) -> str:
    cwd = str(Path.cwd()) + os.sep
    return arg.replace(cwd, "")


class JobFailed(RuntimeError):
    """A command of the comparison exited non-zero; the message holds its command and the end of its log."""


def _executable() -> str:
    found = shutil.which("vlm-grpoma", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                             os.environ.get("PATH", "")]))
    if found is None:
        raise JobFailed("the vlm-grpoma console script is not installed next to this Python; run make test first")
    return found


def _environment(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    for launcher_variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(launcher_variable, None)  # each job is its own one-process run
    return env


def run_jobs(jobs: Sequence[Job], *, workers: int, log_dir: Path,
             report: Callable[[str], None] = print) -> dict[str, float]:
    """Run ``jobs`` respecting ``after``, at most ``workers`` at once, one torch thread each.

    Returns seconds per job name (from the marker for skipped jobs). The first failure stops new jobs, waits
    for the running ones and raises :class:`JobFailed` with the failed command and its log's last lines.
    """
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError("job names must be unique")
    unknown = {dep for job in jobs for dep in job.after} - set(names)
    if unknown:
        raise ValueError(f"jobs wait for unknown jobs: {sorted(unknown)}")
    log_dir.mkdir(parents=True, exist_ok=True)
    executable, env = _executable(), _environment(threads=1)
    seconds: dict[str, float] = {}
    pending = list(jobs)
    for job in list(pending):
        if (done := job.finished_seconds()) is not None:
            seconds[job.name] = done
            pending.remove(job)
            report(f"[compare] {job.name}: done earlier ({done:.0f} s), kept")
    running: dict[str, tuple[Job, subprocess.Popen, float, Path]] = {}
    failure: str | None = None
    while pending or running:
        while failure is None and len(running) < workers:
            ready = next((j for j in pending if all(dep in seconds for dep in j.after)), None)
            if ready is None:
                break
            pending.remove(ready)
            shutil.rmtree(ready.out, ignore_errors=True)
            log = log_dir / (ready.name.replace("/", "__") + ".log")
            with log.open("w") as handle:
                process = subprocess.Popen([executable, *ready.args], stdout=handle, stderr=subprocess.STDOUT,
                                           env=env, cwd=Path.cwd())
            running[ready.name] = (ready, process, time.perf_counter(), log)
            report(f"[compare] {ready.name}: started ({len(seconds)}/{len(jobs)} done)")
        if failure is not None and not running:
            break
        if not running:
            raise JobFailed(f"jobs wait for each other in a cycle: {[j.name for j in pending]}")
        time.sleep(0.5)
        for name, (job, process, started, log) in list(running.items()):
            if process.poll() is None:
                continue
            del running[name]
            elapsed = time.perf_counter() - started
            if process.returncode != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                failure = failure or f"{job.name} failed (exit {process.returncode}): {job.command()}\nlog {log}:\n{tail}"
                continue
            job.out.mkdir(parents=True, exist_ok=True)
            (job.out / MARKER).write_text(json.dumps({"command": job.command(), "seconds": elapsed}))
            seconds[name] = elapsed
            report(f"[compare] {job.name}: finished in {elapsed:.0f} s")
    if failure is not None:
        raise JobFailed(failure)
    return seconds
