"""Device workers of a throw-away host namespace on this machine, for benchmarks: start, wait, stop.

Each worker is the same process `python -m worker.launch` starts (`worker.launch.worker_command`), bound
to its device through its environment, under a fresh ``HYDRA_HOST_ID`` so that its keys and queues never
meet a real host's. Leaving the ``with`` block stops every worker and deletes the namespace's keys.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis

from worker.devices import Device
from worker.launch import worker_command
from worker.processes import stop_processes
from worker.scheduling import telemetry
from worker.scheduling.queue import ShardQueue

STOP_GRACE_S = 15.0
START_TIMEOUT_S = 120.0


class LocalWorkers:
    """Workers for `devices`, against the Redis at `redis_url`, with spill stores and logs under `root`."""

    def __init__(self, *, devices: Sequence[Device], redis_url: str, root: Path, lease_s: float = 10.0) -> None:
        self.devices = list(devices)
        self.redis_url = redis_url
        self.root = root
        self.host_id = f"bench-{uuid.uuid4().hex[:10]}"
        self.client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.queue = ShardQueue(self.client, self.host_id)
        self.lease_s = lease_s
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> LocalWorkers:
        self.root.mkdir(parents=True, exist_ok=True)
        self.queue.configure(lease_s=self.lease_s)
        try:
            for device in self.devices:
                env = {
                    **os.environ, **device.worker_env(),
                    "DJANGO_SETTINGS_MODULE": "webapp.settings", "DEBUG": "1", "REDIS_URL": self.redis_url,
                    "HYDRA_HOST_ID": self.host_id, "HYDRA_SPILL_DIR": str(self.root / "spill"),
                    "HYDRA_DATA_DIR": str(self.root / "data"),
                }
                with open(self.root / f"{device.name}.log", "ab") as log:
                    self.processes.append(subprocess.Popen(
                        worker_command(device, self.host_id, loglevel="WARNING"), env=env, stdout=log,
                        stderr=subprocess.STDOUT, start_new_session=True,
                    ))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None):
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        names = [d.name for d in self.devices]
        while not all(self.queue.devices().get(n, {}).get("seen") for n in names):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"device workers {names} did not start; see the logs in {self.root}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every worker (warm shutdown, then SIGKILL after a grace period) and delete the namespace."""
        stop_processes(self.processes, grace_s=STOP_GRACE_S)
        self.processes.clear()
        keys = list(self.client.scan_iter(match=f"*{self.host_id}*", count=1000))
        if keys:
            self.client.delete(*keys)

    def wait_until_ended(self, trial_ids: Sequence[str], *, timeout_s: float, poll_s: float = 0.2) -> None:
        """Block until every trial is finished, failed or cancelled; raise RuntimeError on a timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = {t: self.queue.trial(t).state for t in trial_ids}
            if all(s in {"finished", "failed", "cancelled"} for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"trials not done after {timeout_s} s: {states}")
            time.sleep(poll_s)

    def entries(self, stream: str) -> list[dict[str, object]]:
        """Every entry of one of the namespace's telemetry streams."""
        out: list[dict[str, object]] = []
        cursor = "0-0"
        while batch := telemetry.read(self.client, self.host_id, stream, after=cursor, count=5000).entries:
            out.extend(batch)
            cursor = str(batch[-1]["id"])
        return out
