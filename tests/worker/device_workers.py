"""Real Celery device workers for integration tests: started as subprocesses, always stopped after."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import redis

from worker.devices import Device
from worker.launch import worker_command
from worker.processes import stop_processes
from worker.scheduling import telemetry
from worker.scheduling.queue import ShardQueue, TrialRecord

STOP_GRACE_S = 15.0


class DeviceWorkers:
    """CPU device workers of one throw-away host namespace, one thread each, logs under `root`."""

    def __init__(self, *, redis_url: str, root: Path, lease_s: float, env: dict[str, str] | None = None) -> None:
        self.redis_url = redis_url
        self.env = env or {}
        self.root = root
        self.host_id = f"test-{uuid.uuid4().hex[:10]}"
        self.client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.queue = ShardQueue(self.client, self.host_id)
        self.queue.configure(lease_s=lease_s)
        self.spill_dir = root / "spill"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, *names: str) -> None:
        """Start the workers of devices ``cpu0``, ``cpu1``... and wait until their loops run."""
        for name in names:
            device = Device("cpu", int(name.removeprefix("cpu")), 1)
            env = {
                **os.environ, **device.worker_env(),
                "DJANGO_SETTINGS_MODULE": "webapp.settings", "DEBUG": "1", "REDIS_URL": self.redis_url,
                "HYDRA_HOST_ID": self.host_id, "HYDRA_SPILL_DIR": str(self.spill_dir),
                "HYDRA_DATA_DIR": str(self.root / "data"), **self.env,
            }
            log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 -- the worker writes it until stopped
            self.processes[name] = subprocess.Popen(
                worker_command(device, self.host_id, loglevel="INFO"), env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
            log.close()
        self.wait(lambda: all(self.queue.devices().get(n, {}).get("seen") for n in names), 90, "loops to start")

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
        stop_processes(self.processes.values(), grace_s=STOP_GRACE_S)
        self.processes.clear()
        keys = list(self.client.scan_iter(match=f"*{self.host_id}*", count=1000))
        if keys:
            self.client.delete(*keys)
        self.client.close()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.root.glob("*.log")))

    def wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{self.logs()}")
            time.sleep(0.05)

    def wait_for_states(self, trial_ids: Iterable[str], states: set[str], timeout_s: float) -> dict[str, TrialRecord]:
        """Wait until every trial is in one of `states`; return their records."""
        ids = list(trial_ids)
        self.wait(lambda: all(self.queue.trial(t).state in states for t in ids), timeout_s,
                  f"trials {ids} to reach {sorted(states)}: {[self.queue.trial(t).state for t in ids]}")
        return {t: self.queue.trial(t) for t in ids}

    def entries(self, stream: str) -> list[dict[str, object]]:
        """Every entry of a telemetry stream of this host, read with the web app's cursor reader."""
        out: list[dict[str, object]] = []
        cursor = "0-0"
        while True:
            batch = telemetry.read(self.client, self.host_id, stream, after=cursor, count=500)
            if not batch.entries:
                return out
            out.extend(batch.entries)
            cursor = batch.cursor
