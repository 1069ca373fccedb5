"""`make run`'s supervisor: a service that exits comes back after a back-off that grows while it keeps failing
at start, is reported as failing, and stopping leaves nothing of any service behind. Real processes, short
back-offs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from worker.processes import Service, Supervisor


class Events(list[dict[str, object]]):
    def of(self, kind: str) -> list[dict[str, object]]:
        return [event for event in self if event["event"] == kind]


def poll_until(supervisor: Supervisor, done, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        supervisor.poll()
        time.sleep(0.01)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def all_gone(pids: list[int], timeout_s: float = 5.0) -> bool:
    """Whether every one of `pids` has ended within `timeout_s`: a SIGKILL sent to a process group is delivered
    asynchronously, so a process of the group may still be listed for a moment after ``killpg`` returns."""
    deadline = time.monotonic() + timeout_s
    while not all(gone(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_killed_service_comes_back_and_its_leftover_children_go():
    events = Events()
    supervisor = Supervisor(report=events.append, backoff_first_s=0.05)
    # The shell leads the group; the sleep it left in the background stands for a Celery pool process.
    first = supervisor.start(Service("worker cpu0", ["sh", "-c", "sleep 100 & wait"]))
    try:
        poll_until(supervisor, lambda: psutil.Process(first.pid).children())
        child = psutil.Process(first.pid).children()[0].pid
        os.kill(first.pid, signal.SIGKILL)
        poll_until(supervisor, lambda: events.of("restarted"))
        assert all_gone([child])
        exited, restarted = events
        assert exited == {"event": "exited", "service": "worker cpu0", "code": -9, "uptime_s": exited["uptime_s"],
                          "restart": 1, "delay_s": 0.05, "failures_in_row": 1, "failing": False}
        assert restarted["restart"] == 1 and restarted["pid"] != first.pid
        assert [p.pid for p in supervisor.processes] == [restarted["pid"]]
    finally:
        supervisor.stop(grace_s=5)


def test_a_service_that_keeps_failing_at_start_backs_off_and_is_reported_failing():
    events = Events()
    supervisor = Supervisor(report=events.append, backoff_first_s=0.01, backoff_max_s=0.04, failing_after=3)
    supervisor.start(Service("ingest", ["sh", "-c", "exit 3"]))
    try:
        poll_until(supervisor, lambda: len(events.of("exited")) >= 5)
    finally:
        supervisor.stop(grace_s=5)
    exits = events.of("exited")[:5]
    assert [e["code"] for e in exits] == [3] * 5
    assert [e["delay_s"] for e in exits] == [0.01, 0.02, 0.04, 0.04, 0.04]
    assert [e["failing"] for e in exits] == [False, False, True, True, True]
    assert [e["restart"] for e in exits] == [1, 2, 3, 4, 5]


def test_a_run_longer_than_the_stable_time_resets_the_back_off():
    events = Events()
    supervisor = Supervisor(report=events.append, backoff_first_s=0.01, stable_after_s=0.2, failing_after=2)
    supervisor.start(Service("web server", ["sh", "-c", "sleep 0.3; exit 1"]))
    try:
        poll_until(supervisor, lambda: len(events.of("exited")) >= 3)
    finally:
        supervisor.stop(grace_s=5)
    assert [(e["delay_s"], e["failures_in_row"], e["failing"]) for e in events.of("exited")[:3]] == [
        (0.01, 1, False)] * 3


def test_stop_ends_every_service_and_what_it_started_the_last_one_after_the_others(tmp_path: Path):
    events = Events()
    supervisor = Supervisor(report=events.append)
    redis = supervisor.start(Service("redis-server", ["sleep", "100"], stops_last=True))
    seen = tmp_path / "redis-alive-at-worker-stop"
    # On SIGTERM the worker checks that the service which stops last still runs, as Celery needs Redis to stop.
    worker = supervisor.start(Service("worker cpu0", [
        "sh", "-c", f'sleep 100 & trap "kill -0 {redis.pid} && touch {seen}; exit 0" TERM; while true; do sleep 0.05;'
                    " done"]))
    time.sleep(0.3)
    children = [p.pid for p in psutil.Process(worker.pid).children()]
    assert children
    supervisor.stop(grace_s=5)
    assert seen.exists()
    assert all_gone([redis.pid, worker.pid, *children])
    supervisor.poll()
    assert supervisor.processes == [] and events == []  # nothing restarted after a stop


def test_a_services_output_goes_to_its_log_every_restart_appended_and_its_niceness_is_kept(tmp_path: Path):
    events = Events()
    supervisor = Supervisor(report=events.append, backoff_first_s=0.05)
    log = tmp_path / "logs" / "worker-cpu0.log"
    script = "ps -o ni= -p $$; echo out; echo err >&2; exit 3"
    supervisor.start(Service("worker cpu0", ["sh", "-c", script], log=log, niceness=7))
    try:
        poll_until(supervisor, lambda: len(events.of("restarted")) == 1 and log.read_text().count("err") == 2)
    finally:
        supervisor.stop(grace_s=5)
    runs = log.read_text().split("---- started ")[1:]
    assert len(runs) >= 2  # the first run's output stays above the restart's
    for run in runs[:2]:
        lines = [line.strip() for line in run.splitlines()[1:]]
        assert lines == [str(os.nice(0) + 7), "out", "err"], run
