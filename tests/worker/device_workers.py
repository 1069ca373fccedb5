"""Real Celery device workers for integration tests: started as subprocesses, always stopped after."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from benchmarks.local_workers import LocalWorkers
from worker.devices import Device
from worker.scheduling.queue import TrialRecord


class DeviceWorkers(LocalWorkers):
    """CPU device workers of one throw-away host namespace, one thread each, logs under `root`; with what
    tests do to them besides (freeze, kill) and waiting on conditions."""

    def __init__(self, *, redis_url: str, root: Path, lease_s: float, env: dict[str, str] | None = None) -> None:
        super().__init__(redis_url=redis_url, root=root, lease_s=lease_s, env=env, host_prefix="test",
                         loglevel="INFO")

    def start(self, *names: str) -> None:  # type: ignore[override]
        """Start the workers of devices ``cpu0``, ``cpu1``... and wait until their loops run."""
        super().start([Device("cpu", int(name.removeprefix("cpu")), 1) for name in names])

    def freeze(self, name: str) -> None:
        """SIGSTOP the worker of `name` and its pool process, so that its state can be read at leisure."""
        os.killpg(self.processes[name].pid, signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        os.killpg(self.processes[name].pid, signal.SIGCONT)

    def kill(self, name: str) -> None:
        """kill -9 the worker of `name` and its pool process."""
        process = self.processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        super().stop()
        self.client.close()

    def wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{self.logs()}")
            time.sleep(0.05)

    def wait_for_records(self, trial_ids: Iterable[str], states: set[str], timeout_s: float) -> dict[str, TrialRecord]:
        """Wait until every trial is in one of `states`; return their records."""
        ids = list(trial_ids)
        self.wait(lambda: all(self.queue.trial(t).state in states for t in ids), timeout_s,
                  f"trials {ids} to reach {sorted(states)}: {[self.queue.trial(t).state for t in ids]}")
        return {t: self.queue.trial(t) for t in ids}
