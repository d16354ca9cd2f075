"""A process pool of SAPIEN workers with crash isolation.

Each worker holds one pipe and runs one job at a time, so when a worker dies (segfault, OOM kill) the pool
knows exactly which job it was running: the worker is replaced, the other jobs carry on, and the job is either
run again on a fresh worker (``map(..., retries=N)``, for jobs that depend only on their arguments, such as
sampling an episode) or reported as a ``WorkerCrash`` (an executed episode fails with ``worker_crash``: the
action may be what crashed the simulator). A worker that exceeds the hard per-job deadline is killed the
same way. Every episode builds a fresh scene, which takes a few milliseconds
and makes a result independent of which worker ran it and what ran before: the same jobs give the same
results for any number of workers, in any process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait

from vlm_grpoma.answers import ContactAction
from vlm_grpoma.envs.sapien.manipllm import sample_asset
from vlm_grpoma.envs.sapien.task import (
    DEFAULT_EXEC,
    EpisodeSpec,
    ExecConfig,
    Outcome,
    execute,
    sample_split_episode,
)

HARD_DEADLINE_SLACK_S = 60.0


@dataclass(frozen=True)
class WorkerCrash:
    """Stands in for the result of a job whose worker died or was killed."""

    reason: str  # "worker_crash" or "timeout"
    detail: str = ""
    attempts: int = 1


def _execute_job(spec: EpisodeSpec, action: ContactAction, config: ExecConfig) -> Outcome:
    try:
        return execute(spec, action, config)
    except Exception as err:  # a simulator error fails the episode, it does not stop the batch
        return Outcome.failed("sim_error", detail=f"{type(err).__name__}: {err}"[:200])


JOBS: dict[str, Callable] = {
    "execute": _execute_job,
    "sample": sample_split_episode,
    "sample_asset": sample_asset,
}


def _worker_main(conn: Connection) -> None:
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        name, args, kwargs = message
        try:
            conn.send(("ok", JOBS[name](*args, **kwargs)))
        except Exception as err:
            conn.send(("error", f"{type(err).__name__}: {err}"))


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: Connection
    job: int | None = None
    started: float = 0.0


class SimPool:
    """``SimPool(workers)``; ``map(jobs)`` runs ``(name, args, kwargs)`` jobs and returns results in order."""

    def __init__(
        self,
        workers: int = 0,
        *,
        job_deadline_s: float = DEFAULT_EXEC.timeout_s + HARD_DEADLINE_SLACK_S,
        start_method: str = "spawn",
    ):
        # 0: this process's share of the cores (the launcher's LOCAL_WORLD_SIZE ranks share one machine)
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.size = workers if workers > 0 else max(1, (os.cpu_count() or 1) // local_ranks)
        self.job_deadline_s = job_deadline_s
        self._ctx = mp.get_context(start_method)
        self._workers = [self._spawn() for _ in range(self.size)]
        self.crashes = 0
        self.retried = 0

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main, args=(child,), daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent)

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def _replace(self, worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()
        self._workers[self._workers.index(worker)] = self._spawn()
        self.crashes += 1

    def map(self, jobs: Sequence[tuple[str, tuple, dict]], *, retries: int = 0) -> list:
        """Run jobs; a job that raised returns ``RuntimeError``. A job whose worker died or froze runs again on
        a fresh worker up to ``retries`` times, then returns a ``WorkerCrash`` saying how often it was tried."""
        results: list = [None] * len(jobs)
        crashes: list[int] = [0] * len(jobs)
        pending = deque(range(len(jobs)))
        running = 0
        while pending or running:
            for worker in list(self._workers):
                if worker.job is None and pending:
                    index = pending.popleft()
                    try:
                        worker.conn.send(jobs[index])
                    except (BrokenPipeError, OSError):  # died while idle: replace it, the job never started
                        pending.appendleft(index)
                        self._replace(worker)
                        continue
                    worker.job, worker.started = index, time.monotonic()
                    running += 1
            busy = [w for w in self._workers if w.job is not None]
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=1.0)
            for worker in busy:
                index = worker.job
                crash = None
                if worker.conn in ready:
                    try:
                        status, value = worker.conn.recv()
                    except (EOFError, OSError):
                        crash = WorkerCrash("worker_crash", f"worker {worker.process.pid} died")
                    else:
                        results[index] = value if status == "ok" else RuntimeError(value)
                        worker.job = None
                elif worker.process.sentinel in ready:
                    crash = WorkerCrash("worker_crash", f"worker {worker.process.pid} died")
                elif time.monotonic() - worker.started > self.job_deadline_s:
                    crash = WorkerCrash("timeout", f"killed after {self.job_deadline_s:g} s")
                else:
                    continue
                running -= 1
                if crash is None:
                    continue
                self._replace(worker)
                crashes[index] += 1
                if crashes[index] <= retries:
                    pending.appendleft(index)
                    self.retried += 1
                else:
                    results[index] = replace(crash, attempts=crashes[index])
        return results

    def execute(
        self, episodes: Sequence[tuple[EpisodeSpec, ContactAction]], config: ExecConfig = DEFAULT_EXEC
    ) -> list[Outcome]:
        """Score (spec, action) pairs in parallel; crashed or failed jobs come back as failed outcomes."""
        results = self.map([("execute", (spec, action, config), {}) for spec, action in episodes])
        return [
            r
            if isinstance(r, Outcome)
            else Outcome.failed(r.reason, detail=r.detail)
            if isinstance(r, WorkerCrash)
            else Outcome.failed("sim_error", detail=str(r))
            for r in results
        ]

    def close(self) -> None:
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for worker in self._workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
            worker.conn.close()
        self._workers = []

    def __enter__(self) -> SimPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
