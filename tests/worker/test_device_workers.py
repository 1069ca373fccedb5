"""Real Celery device workers running synthetic trials: interleaving, control and failures; stopping with their
Redis gone; and the benchmarks' workers, which end with the script that started them."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from benchmarks.local_workers import LocalWorkers
from tests.private_redis import PrivateRedis
from worker.contract import SyntheticJob
from worker.devices import Device, cpu_cores
from worker.scheduling.keys import HOSTS_KEY

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)


def test_it_runs_trials_on_two_devices_units_interleaved(shared_device_workers) -> None:
    workers = shared_device_workers
    for name in "abc":
        workers.queue.submit(trial_id=name, job=SyntheticJob(units=8, unit_ms=20), export_dir="")
    records = workers.wait_for_records("abc", {"finished"}, 60)
    assert all(r.units_done == 8 for r in records.values())

    spans = [s for s in workers.entries("spans") if s["phase"] != "plan" and s["trial"] in {"a", "b", "c"}]
    assert len(spans) == 24
    by_device = {d: [s["trial"] for s in spans if s["device"] == d] for d in ("cpu0", "cpu1")}
    assert all(len(set(trials)) > 1 for trials in by_device.values()), by_device
    assert any(len({s["device"] for s in spans if s["trial"] == t}) == 2 for t in "abc"), by_device
    for trial in "abc":  # one unit of a trial at a time, in order
        own = sorted((s for s in spans if s["trial"] == trial), key=lambda s: s["start"])
        assert [s["unit"] for s in own] == list(range(8))
        assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(own))
    events = [e for e in workers.entries("events") if e["trial"] == "a"]
    states = [(e["trial"], e["state"]) for e in events]
    assert states[:2] == [("a", "planning"), ("a", "runnable")] and states[-1] == ("a", "finished")
    assert events[-1]["steps_done"] == "8"  # what the web app shows as done before the metrics arrive

    available = sorted(os.sched_getaffinity(0))  # each device loop runs pinned to its own core(s)
    loops = {s["device"]: int(s["pid"]) for s in spans}
    assert {d: sorted(os.sched_getaffinity(pid)) for d, pid in loops.items()} == {
        "cpu0": cpu_cores(0, 1, available), "cpu1": cpu_cores(1, 1, available)}


def test_it_pauses_resumes_and_cancels_at_unit_boundaries(shared_device_workers) -> None:
    workers = shared_device_workers
    queue = workers.queue
    for name in ("paused", "cancelled", "other"):
        queue.submit(trial_id=name, job=SyntheticJob(units=40, unit_ms=25), export_dir="")
    workers.wait(lambda: all(queue.trial(t).units_done >= 2 for t in ("paused", "cancelled")), 30, "progress")

    queue.pause("paused")
    queue.cancel("cancelled")
    records = workers.wait_for_records(["paused", "cancelled"], {"paused", "cancelled"}, 10)
    assert (records["paused"].state, records["cancelled"].state) == ("paused", "cancelled")
    frozen = queue.trial("paused").units_done
    workers.wait(lambda: queue.trial("other").units_done >= frozen + 4, 30, "the other trial to go on")
    assert queue.trial("paused").units_done == frozen

    assert queue.resume("paused") == "runnable"
    records = workers.wait_for_records(["paused", "other"], {"finished"}, 60)
    assert records["paused"].units_done == 40
    assert queue.trial("cancelled").state == "cancelled"
    assert queue.trial("cancelled").units_done < 40


def test_it_fails_one_trial_and_finishes_the_others(shared_device_workers) -> None:
    workers = shared_device_workers
    workers.queue.submit(trial_id="bad", job=SyntheticJob(units=6, unit_ms=10, fail_at_unit=3), export_dir="")
    for name in ("good1", "good2"):
        workers.queue.submit(trial_id=name, job=SyntheticJob(units=10, unit_ms=10), export_dir="")
    records = workers.wait_for_records(["bad", "good1", "good2"], {"finished", "failed"}, 60)
    assert records["bad"].state == "failed"
    assert "unit 3 failed on cpu" in records["bad"].message
    assert "SyntheticUnitError: synthetic unit 3 of trial 'bad' failed on purpose" in records["bad"].message
    assert records["good1"].state == records["good2"].state == "finished"


def test_a_wait_for_trials_to_end_returns_when_the_last_ended_by_its_event_not_by_when_it_read_it(
        shared_device_workers) -> None:
    workers = shared_device_workers
    submitted = workers.clock()
    for name in ("early", "late"):
        workers.queue.submit(trial_id=name, job=SyntheticJob(units=3 if name == "early" else 6, unit_ms=30),
                             export_dir="")
    ended = workers.wait_until_ended(["early", "late"], timeout_s=60)

    finished = {e["trial"]: e["id"] for e in workers.entries("events")
                if e["trial"] in {"early", "late"} and e["state"] == "finished"}
    last = max(finished.values(), key=lambda entry_id: tuple(map(int, entry_id.split("-"))))
    assert ended == int(last.split("-")[0]) / 1000  # the millisecond Redis stamped on the last one's event
    assert submitted < ended <= workers.clock()
    called = workers.clock()
    assert workers.wait_until_ended(["early", "late"], timeout_s=1) >= called  # both ended already: the call's time


_STARTS_WORKERS = """
import sys, time
from pathlib import Path
from benchmarks.local_workers import LocalWorkers
from worker.devices import Device
workers = LocalWorkers(devices=[Device("cpu", 0, 1)], redis_url=sys.argv[1], root=Path(sys.argv[2]))
workers.__enter__()
print(workers.host_id, *(p.pid for p in workers.processes.values()), flush=True)
time.sleep(600)
"""


@pytest.mark.processes
def test_a_benchmark_killed_before_it_stops_its_workers_takes_them_with_it(redis_url, redis_client, tmp_path) -> None:
    script = subprocess.Popen([sys.executable, "-c", _STARTS_WORKERS, redis_url, str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    assert script.stdout is not None
    host_id, *pids = script.stdout.readline().split()
    workers = [psutil.Process(int(pid)) for pid in pids]
    pool = [child for worker in workers for child in worker.children(recursive=True)]
    try:
        assert workers and pool  # a Celery parent per device, and its pool process running the device loop
        script.kill()  # no `with` block left, no signal handler: SIGKILL
        script.wait()
        _, alive = psutil.wait_procs([*workers, *pool], timeout=60)
        assert alive == [], f"still running after the script that started them was killed: {alive}"
    finally:
        for process in [*workers, *pool]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        keys = list(redis_client.scan_iter(match=f"*{host_id}*", count=1000))
        if keys:
            redis_client.delete(*keys)
        redis_client.zrem(HOSTS_KEY, host_id)


@pytest.mark.processes
def test_a_worker_told_to_stop_while_its_redis_is_gone_stops(tmp_path) -> None:
    """Its loop hears of a stop through Redis; with Redis gone (killed, or unreachable) the warm shutdown ends the
    loop's process instead of waiting for it for ever."""
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    workers = LocalWorkers(devices=[Device("cpu", 0, 1)], redis_url=server.url, root=tmp_path / "workers")
    workers.start(workers.devices)
    (worker,) = workers.processes.values()
    family = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
    try:
        assert len(family) >= 2  # the Celery parent, and the pool process running the device loop
        server.kill()
        time.sleep(1)  # the loop finds Redis gone, and keeps surveying for it
        worker.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(family, timeout=30)
        assert alive == [], f"still running 30 s after SIGTERM with Redis gone: {alive}\n{workers.logs()}"
    finally:
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        server.kill()
