"""Stopping on a signal: the first SIGINT/SIGTERM finishes the step, checkpoints and stops; a second
aborts the step, but never a checkpoint being written (docs/ROBUSTNESS.md, "SIGINT / SIGTERM")."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable


class StopRequest:
    """Whether training should stop after the current step: `received` (a signal arrived here) and
    `requested` (the loop acts on it; under data parallelism the trainer sets it on every rank in
    the same step, so that all ranks stop together)."""

    def __init__(self, log: Callable[[str], None], across_ranks: bool = False):
        self.log = log
        self.across_ranks = across_ranks
        self.received = False
        self.requested = False
        self.saving = False  # a checkpoint is being written: a second signal waits for it

    def handle(self, signum, frame) -> None:
        if self.received:
            if self.saving:
                self.log("still writing the checkpoint: it finishes in a moment, then training stops")
                return
            raise KeyboardInterrupt
        self.received = True
        if not self.across_ranks:
            self.requested = True
        self.log(f"received {signal.Signals(signum).name}: finishing the step and checkpointing")

    @contextmanager
    def saving_checkpoint(self):
        """A checkpoint is written inside this block: a second SIGINT does not cut it short."""
        self.saving = True
        try:
            yield
        finally:
            self.saving = False

    @contextmanager
    def installed(self):
        """Handle SIGINT/SIGTERM while the block runs, then restore the previous handlers.
        Python delivers signals to the main thread only, so elsewhere this does nothing."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
