"""Device workers of a throw-away host namespace on this machine, for benchmarks and tests.

Each worker is the same process `python -m worker.launch` starts (`worker.launch.worker_command`), bound
to its device through its environment, under a fresh ``HYDRA_HOST_ID`` so that its keys and queues never
meet a real host's. Leaving the ``with`` block stops every worker and deletes the namespace's keys. A script
killed before it leaves the block (SIGTERM, SIGKILL) takes its workers with it: each gets SIGTERM when the
process that started it dies (Linux), rather than going on beside the next benchmark's.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import redis

from worker.contract import ENDED, EngineJob, TrialRecord
from worker.devices import Device
from worker.launch import worker_command
from worker.processes import stop_processes, stop_with_parent
from worker.scheduling import telemetry
from worker.scheduling.keys import HOSTS_KEY
from worker.scheduling.queue import ShardQueue

if TYPE_CHECKING:
    from worker.engine.config import TrialSpec

STOP_GRACE_S = 15.0
START_TIMEOUT_S = 120.0
READ_PERIOD_S = 0.1  # how often a wait reads the events stream


class LocalWorkers:
    """Workers for `devices`, against the Redis at `redis_url`, with spill stores and logs under `root`.

    As a context manager it starts every device's worker and stops them all on leaving. Tests start
    workers one by one with `start` (and must call `stop`). `env` adds variables to each worker's
    environment; `host_prefix` starts the namespace's name.
    """

    def __init__(self, *, devices: Sequence[Device] = (), redis_url: str, root: Path, lease_s: float = 10.0,
                 env: Mapping[str, str] | None = None, host_prefix: str = "bench", loglevel: str = "WARNING") -> None:
        self.devices = list(devices)
        self.redis_url = redis_url
        self.root = root
        self.env = dict(env or {})
        self.loglevel = loglevel
        self.host_id = f"{host_prefix}-{uuid.uuid4().hex[:10]}"
        self.client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.queue = ShardQueue(self.client, self.host_id)
        self.lease_s = lease_s
        self.spill_dir = root / "spill"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}  # device name -> its worker

    def __enter__(self) -> LocalWorkers:
        try:
            self.start(self.devices)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None):
        self.stop()

    def worker_env(self, device: Device) -> dict[str, str]:
        """The environment of `device`'s worker: bound to the device, in this namespace, under `root`."""
        return {
            **os.environ, **device.worker_env(),
            "REDIS_URL": self.redis_url,
            "HYDRA_HOST_ID": self.host_id, "HYDRA_SPILL_DIR": str(self.spill_dir),
            "HYDRA_DATA_DIR": str(self.root / "data"), **self.env,
        }

    def start(self, devices: Sequence[Device]) -> None:
        """Start a worker per device and wait until their loops run; RuntimeError if one does not start."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.queue.configure(lease_s=self.lease_s)
        for device in devices:
            with open(self.root / f"{device.name}.log", "ab") as log:
                self.processes[device.name] = subprocess.Popen(
                    worker_command(device, self.host_id, loglevel=self.loglevel), env=self.worker_env(device),
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=stop_with_parent,
                )
        self._wait_ready([d.name for d in devices])

    def _wait_ready(self, names: Sequence[str]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(self.queue.devices().get(n, {}).get("seen") for n in names):
            if time.monotonic() > deadline or any(self.processes[n].poll() is not None for n in names):
                raise RuntimeError(f"device workers {list(names)} did not start; see the logs in {self.root}\n"
                                   f"{self.logs()}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every worker (warm shutdown, then SIGKILL after a grace period) and delete the namespace."""
        stop_processes(self.processes.values(), grace_s=STOP_GRACE_S)
        self.processes.clear()
        keys = list(self.client.scan_iter(match=f"*{self.host_id}*", count=1000))
        if keys:
            self.client.delete(*keys)
        self.client.zrem(HOSTS_KEY, self.host_id)  # the lab no longer has this host

    def logs(self) -> str:
        """The end of every worker's log."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.root.glob("*.log")))

    def run_trials(self, specs: Mapping[str, TrialSpec], *, export_root: Path,
                   timeout_s: float) -> tuple[float, dict[str, TrialRecord]]:
        """Submit every trial of `specs` (trial id -> spec) to this host, each exported into ``export_root /
        <trial id>``, and wait until all ended: the seconds from the first submission to the last end (both read on
        `clock`, see `wait_for_states`), and each trial's record. RuntimeError, with each failed trial's message,
        if one did not finish."""
        start = self.clock()
        for trial_id, spec in specs.items():
            self.queue.submit(trial_id=trial_id, job=EngineJob(trial=spec), export_dir=str(export_root / trial_id))
        seconds = self.wait_until_ended(list(specs), timeout_s=timeout_s) - start
        records = {r.trial_id: r for r in self.queue.trials() if r.trial_id in specs}
        failed = {t: r.message for t, r in records.items() if r.state != "finished"}
        if failed:
            raise RuntimeError(f"trials failed: {failed}")
        return seconds, records

    def clock(self) -> float:
        """The Redis server's clock, in seconds: the clock of the events stream's entries (see `wait_for_states`)."""
        seconds, microseconds = self.client.time()
        return seconds + microseconds / 1e6

    def wait_until_ended(self, trial_ids: Sequence[str], *, timeout_s: float) -> float:
        """Block until every trial ended (finished, pruned, failed or cancelled); raise RuntimeError on a timeout.
        Returns when the last of them ended, on `clock` (see `wait_for_states`)."""
        return self.wait_for_states(trial_ids, ENDED, timeout_s=timeout_s)

    def wait_for_states(self, trial_ids: Sequence[str], wanted: Collection[str], *, timeout_s: float) -> float:
        """Block until every trial is in one of the `wanted` states; raise RuntimeError on a timeout.

        Follows the host's events stream, which says each trial's state as it changes: the states are read
        once, then only events, at most ten times a second. Re-reading every trial at each event, or waking
        at each of a thousand trials' events, would take the CPU and Redis from the devices being measured.

        Returns when the last of the trials got there, on `clock`: the time in its event's id, which Redis
        stamps with its own clock, to the millisecond, as it adds the event (or `clock` at the call, when every
        trial was there already). A run timed with it is not late by this wait's reading period, up to a tenth
        of a second of runs that may take one or two.
        """
        deadline = time.monotonic() + timeout_s
        last = self.client.xrevrange(self.queue.key("events"), count=1)
        cursor = last[0][0] if last else "0-0"
        arrived = self.clock()
        states = self.queue.states()
        if missing := set(trial_ids) - states.keys():
            raise RuntimeError(f"no such trials on this host: {sorted(missing)}")
        waiting = {t for t in trial_ids if states[t] not in wanted}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{len(waiting)} trials not done after {timeout_s} s: {sorted(waiting)[:10]}")
            for _, entries in self.client.xread({self.queue.key("events"): cursor}, block=int(min(left, 1.0) * 1000)):
                cursor = entries[-1][0]
                for entry_id, fields in entries:
                    if fields["trial"] in waiting and fields["state"] in wanted:
                        waiting.discard(fields["trial"])
                        arrived = int(entry_id.partition("-")[0]) / 1000
            if waiting:
                time.sleep(min(READ_PERIOD_S, max(0.0, deadline - time.monotonic())))
        return arrived

    def entries(self, stream: str) -> list[dict[str, object]]:
        """Every entry of one of the namespace's telemetry streams."""
        out: list[dict[str, object]] = []
        cursor = "0-0"
        while batch := telemetry.read(self.client, self.host_id, stream, after=cursor, count=5000).entries:
            out.extend(batch)
            cursor = str(batch[-1]["id"])
        return out
