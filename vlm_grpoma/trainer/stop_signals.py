"""Stopping a training run cleanly on a signal: Ctrl-C (SIGINT), SIGTERM (a scheduler preempting the job) and
SIGUSR1 (Slurm's warning before the time limit, ``--signal=USR1@<s>``) let the current step finish; the loop
then saves a checkpoint and the process exits with :data:`STOPPED_EXIT_CODE`. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

#: The signals that ask a run to save and stop.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
#: Exit code of a run that a signal stopped after its checkpoint was saved (sysexits' EX_TEMPFAIL: run the
#: same command with ``checkpoint.resume=auto`` to continue).
STOPPED_EXIT_CODE = 75


class StopRequest:
    """Within its ``with`` block (main thread), the stop signals only set :attr:`signal_name`; the handlers that
    were there before come back at exit."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signal_name = signal.Signals(signum).name
        # os.write, not print: a handler may run while the main thread is inside a write to stderr.
        os.write(
            2,
            f"{self.signal_name}: finishing the current step, then saving a checkpoint and stopping "
            "(Ctrl-C again stops at once, without saving)\n".encode(),
        )
