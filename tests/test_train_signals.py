"""train.signals: SIGINT and SIGTERM only set a flag inside the block, and the old handlers come back after it."""
from __future__ import annotations

import os
import signal

from train.signals import StopRequested


def test_a_signal_sets_the_flag_and_the_handlers_are_restored():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with StopRequested() as stop:
        assert not stop.flag
        os.kill(os.getpid(), signal.SIGTERM)  # would end the test process without the handler
        assert stop.flag
    with StopRequested() as again:
        os.kill(os.getpid(), signal.SIGINT)
        assert again.flag
    assert {sig: signal.getsignal(sig) for sig in before} == before
