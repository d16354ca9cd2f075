"""The comparison as a graph of ``vlm-grpoma`` commands, run a few at a time as separate processes.

Each job is one CLI command (so every number in the report comes from commands a user can paste) with an
output folder and the jobs it waits for: a ``vlm-grpoma`` command, or a script of ``benchmarks/`` run with this
Python. A finished job leaves ``.compare-done`` in that folder: its command,
seconds, a run id, the run ids of the jobs it waited for and the package version. A rerun keeps a job only
when all of those still hold (so rebuilding a warm start reruns every arm that started from it) and clears
the folder of any job it runs (a run stopped half-way would otherwise append to its metrics).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vlm_grpoma import __version__
from vlm_grpoma.distributed import free_port

MARKER = ".compare-done"
REPO = Path(__file__).resolve().parents[2]
LAUNCHER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CROSS_RANK",
    "CROSS_SIZE",
)


@dataclass(frozen=True)
class Timing:
    """When a finished job ran (Unix seconds) and for how long."""

    seconds: float
    started_at: float
    finished_at: float

    @classmethod
    def from_marker(cls, marker: dict) -> Timing:
        return cls(float(marker["seconds"]), float(marker["started_at"]), float(marker["finished_at"]))


@dataclass(frozen=True)
class Job:
    """One ``vlm-grpoma`` command (or, with ``script``, ``python SCRIPT``: a path relative to the repository)
    writing into ``out``; runs after every job named in ``after``."""

    name: str
    args: tuple[str, ...]
    out: Path
    after: tuple[str, ...] = ()
    script: str = ""
    threads: int = (
        1  # torch threads; a job takes that many of the runner's worker slots (at most all of them)
    )

    def command(self) -> str:
        """The command line as a user would type it from the repository root."""
        program = f"python {self.script}" if self.script else "vlm-grpoma"
        return f"{program} " + shlex.join(_relative(a) for a in self.args)

    def argv(self, executable: str) -> list[str]:
        """The process to start: the ``vlm-grpoma`` console script ``executable``, or this Python on the script."""
        if self.script:
            return [sys.executable, str(REPO / self.script), *self.args]
        return [executable, *self.args]

    def marker(self) -> dict | None:
        """The finished-job marker in ``out`` when it records this exact command and package version."""
        path = self.out / MARKER
        try:
            done = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        same = done.get("command") == self.command() and done.get("version") == __version__
        return done if same else None

    def finished(self) -> Timing | None:
        """When the job ran, if its marker matches (its dependencies are not checked here)."""
        done = self.marker()
        return None if done is None else Timing.from_marker(done)


def _relative(arg: str) -> str:
    cwd = str(Path.cwd()) + os.sep
    return arg.replace(cwd, "")


class JobFailed(RuntimeError):
    """A command of the comparison exited non-zero; the message holds its command and the end of its log."""


def _executable() -> str:
    found = shutil.which(
        "vlm-grpoma", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    if found is None:
        raise JobFailed(
            "the vlm-grpoma console script is not installed next to this Python; run make test first"
        )
    return found


def _environment(threads: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARIABLES and not k.startswith("TORCHELASTIC_")
    }
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    return env  # each job is its own one-process run; run_jobs gives each a distinct MASTER_PORT


def _distinct_port(taken: set[str]) -> str:
    """A free port no running job was given (two jobs started together must not rendezvous on one port)."""
    while (port := str(free_port())) in taken:
        pass
    return port


def _kept(jobs: Sequence[Job]) -> dict[str, dict]:
    """Markers of the jobs a rerun can keep: same command and version, and every job waited for kept with the
    run id the marker recorded. ``jobs`` is in an order where dependencies come first."""
    kept: dict[str, dict] = {}
    for job in jobs:
        done = job.marker()
        if done is not None and all(
            dep in kept and done.get("after", {}).get(dep) == kept[dep]["run_id"] for dep in job.after
        ):
            kept[job.name] = done
    return kept


def _topological(jobs: Sequence[Job]) -> list[Job]:
    ordered, placed, waiting = [], set(), list(jobs)
    while waiting:
        ready = [j for j in waiting if set(j.after) <= placed]
        if not ready:
            raise ValueError(f"jobs wait for each other in a cycle: {[j.name for j in waiting]}")
        for job in ready:
            ordered.append(job)
            placed.add(job.name)
            waiting.remove(job)
    return ordered


def run_jobs(
    jobs: Sequence[Job], *, workers: int, log_dir: Path, report: Callable[[str], None] = print
) -> dict[str, Timing]:
    """Run ``jobs`` respecting ``after``, as many at once as their threads fit in ``workers`` slots (a job
    wanting more than ``workers`` threads runs alone with ``workers``).

    Returns each job's timing (from its marker for a kept job). The first failure stops new jobs, waits
    for the running ones and raises :class:`JobFailed` with the failed command and its log's last lines.
    """
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError("job names must be unique")
    unknown = {dep for job in jobs for dep in job.after} - set(names)
    if unknown:
        raise ValueError(f"jobs wait for unknown jobs: {sorted(unknown)}")
    ordered = _topological(jobs)
    log_dir.mkdir(parents=True, exist_ok=True)
    executable = _executable()
    done = _kept(ordered)
    for name, marker in done.items():
        report(f"[compare] {name}: done earlier ({marker['seconds']:.0f} s), kept")
    pending = [job for job in ordered if job.name not in done]
    running: dict[str, tuple[Job, subprocess.Popen, float, Path, str]] = {}
    failure: str | None = None
    while pending or running:
        while failure is None and len(running) < workers:
            ready = next((j for j in pending if all(dep in done for dep in j.after)), None)
            busy = sum(min(job.threads, workers) for job, *_ in running.values())
            if ready is None or (running and busy + min(ready.threads, workers) > workers):
                break
            pending.remove(ready)
            if ready.out.exists():
                shutil.rmtree(ready.out)
            log = log_dir / (ready.name.replace("/", "__") + ".log")
            port = _distinct_port({port for *_, port in running.values()})
            with log.open("w") as handle:
                process = subprocess.Popen(
                    ready.argv(executable),
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    env={**_environment(min(ready.threads, workers)), "MASTER_PORT": port},
                    cwd=Path.cwd(),
                )
            running[ready.name] = (ready, process, time.time(), log, port)
            report(f"[compare] {ready.name}: started ({len(done)}/{len(jobs)} done)")
        if not running:
            break  # a failure stopped new jobs (pending jobs always become ready: the graph has no cycle)
        time.sleep(0.5)
        for name, (job, process, started, log, _) in list(running.items()):
            if process.poll() is None:
                continue
            del running[name]
            finished_at = time.time()
            elapsed = finished_at - started
            if process.returncode != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                failure = (
                    failure
                    or f"{job.name} failed (exit {process.returncode}): {job.command()}\nlog {log}:\n{tail}"
                )
                continue
            job.out.mkdir(parents=True, exist_ok=True)
            marker = {
                "command": job.command(),
                "seconds": elapsed,
                "started_at": started,
                "finished_at": finished_at,
                "run_id": uuid.uuid4().hex,
                "after": {dep: done[dep]["run_id"] for dep in job.after},
                "version": __version__,
            }
            (job.out / MARKER).write_text(json.dumps(marker))
            done[name] = marker
            report(f"[compare] {job.name}: finished in {elapsed:.0f} s")
    if failure is not None:
        raise JobFailed(failure)
    return {job.name: Timing.from_marker(done[job.name]) for job in jobs}
