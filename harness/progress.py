"""A step that runs long shows in the progress: a first call that compiles or autotunes for
minutes (upstream fla's, on an empty cache) says which implementation and how long so far, rather
than leaving the bar still."""
from __future__ import annotations

import threading
import time

SLOW_STEP_S = 10.0   # a step shown once it has run this long
TICK_S = 1.0


def slow_step_text(case_id: str, step: str, seconds: float) -> str:
    """'rwkv6-bf16-...: chunk (fla.ops.rwkv6:chunk_rwkv6): its run, 95 s so far'."""
    return f"{case_id}: {step}, {seconds:.0f} s so far"


class SlowStepClock:
    """Every TICK_S, hands `show` the line of the watched case's step once it has run SLOW_STEP_S
    (a thread of its own: the step itself blocks the sweep's thread)."""

    def __init__(self, show, enabled: bool = True):
        self.show, self.where = show, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if enabled else None
        if self._thread:
            self._thread.start()

    def watch(self, where):
        """Follow `where` (a CaseInProgress: its step and when the step began) from now on."""
        self.where = where
        return where

    def _run(self):
        while not self._stop.wait(TICK_S):
            where = self.where
            step = where.get("step") if where is not None else None
            if step and time.monotonic() - where.step_since >= SLOW_STEP_S:
                self.show(slow_step_text(where.case_id, step, time.monotonic() - where.step_since))

    def stop(self):
        self._stop.set()
