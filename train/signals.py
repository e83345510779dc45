"""Ctrl-C and SIGTERM (a scheduler's preemption notice) end a run cleanly: at the end of the current step."""
from __future__ import annotations

import signal


class StopRequested:
    """SIGINT/SIGTERM set `flag`; the loop saves a checkpoint at the end of the current step and leaves."""

    def __init__(self):
        self.flag = False
        self._old = {}

    def __enter__(self) -> "StopRequested":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.flag = True

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
