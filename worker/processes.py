"""Running the child processes that Hydra's launchers start, restarting those that exit, and stopping them so
that nothing is left running.

`Supervisor` keeps a set of services running: a service that exits is started again after a back-off (1 s,
doubled after each exit within a minute of its start, at most 30 s; a run of a minute or more resets it), and
every exit and restart is reported through a callback as a plain dict, so that the caller can print it and
record it where the health page reads it. A service that exits `FAILING_AFTER` times in a row within a minute
of starting (a bad configuration, a port taken) is reported as failing at each exit and still retried every
30 s: whatever made it fail may go away (a disk freed, a port released), and each retry says so again.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0
FAILING_AFTER = 5
PR_SET_PDEATHSIG = 1  # prctl(2)
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def stop_with_parent() -> None:
    """In a child, between fork and exec (``preexec_fn``): SIGTERM when the thread that started it exits, on Linux.
    A launcher killed outright (SIGKILL, the out-of-memory killer) then takes its children with it, each through
    its own SIGTERM handling (a worker's warm shutdown), instead of leaving them running in their own sessions."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class StopSignals:
    """From construction on (in the main thread), SIGINT, SIGTERM and SIGHUP set `requested` instead of ending
    the process: a launcher's loop sees it, ends, and stops its children in order (`stop_processes`), rather
    than dying at once and leaving them running. SIGHUP is what a launcher gets when its terminal closes (or
    its SSH session drops); its children run in sessions of their own and get nothing, so dying of it would
    leave them all running, holding their devices and ports. A launcher started with SIGHUP ignored (under
    ``nohup``) keeps ignoring it."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGINT, self._request)
        signal.signal(signal.SIGTERM, self._request)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            signal.signal(signal.SIGHUP, self._request)

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True


def stop_processes(processes: Iterable[subprocess.Popen[bytes]], *, grace_s: float) -> None:
    """SIGTERM every live process (newest first), wait up to `grace_s` in all, then SIGKILL each one's group.

    Each process is expected to lead its own process group (``start_new_session=True``): the final SIGKILL of
    the group also ends what it started and left behind (a Celery pool process, say), even after a clean exit.
    """
    processes = list(processes)
    for process in reversed(processes):
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in reversed(processes):
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        kill_group(process)
        process.wait()


def _prepare_child(niceness: int) -> None:
    stop_with_parent()
    if niceness:
        os.nice(niceness)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group `process` leads: what it started and left behind goes with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Service:
    """A command to keep running. `name` is what reports call it (``redis-server``, ``worker cpu0``).
    `stops_last`: stopped only once every other service has stopped (the Redis the others talk to while they
    shut down: a worker's warm shutdown ends its device loop through it)."""

    name: str
    command: Sequence[str]
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    stops_last: bool = False
    log: Path | None = None  # where its output is appended (every restart's too); None: the supervisor's own
    niceness: int = 0  # added to its CPU niceness: a higher one yields the cores to the other services


def open_log(path: Path) -> IO[bytes]:
    """`path` opened for appending (its folder made first), with a line that says when this process started."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.open("ab")
    log.write(f"---- started {time.strftime('%Y-%m-%d %H:%M:%S')} ----\n".encode())
    log.flush()
    return log


@dataclass(eq=False)
class _Running:
    service: Service
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures_in_row: int = 0
    start_at: float | None = None  # when a service that exited is due to start again


class Supervisor:
    """Start services (`start`), restart those that exit (`poll`), stop them all (`stop`). Not thread-safe: one
    loop calls `poll` a few times a second."""

    def __init__(
        self, *, report: Callable[[dict[str, object]], None], backoff_first_s: float = BACKOFF_FIRST_S,
        backoff_max_s: float = BACKOFF_MAX_S, stable_after_s: float = STABLE_AFTER_S,
        failing_after: int = FAILING_AFTER,
    ) -> None:
        self._running: list[_Running] = []
        self._stopped = False
        self._report = report
        self.backoff_first_s = backoff_first_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
        self.failing_after = failing_after

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        """The live process of every service, in the order the services were added."""
        return [r.process for r in self._running if r.process is not None and r.process.poll() is None]

    @property
    def names(self) -> list[str]:
        return [r.service.name for r in self._running]

    def start(self, service: Service) -> subprocess.Popen[bytes]:
        """Start `service` now and keep it running from then on; returns its first process."""
        if service.name in self.names:
            raise ValueError(f"a service named {service.name!r} is already supervised")
        running = _Running(service)
        self._running.append(running)
        self._start(running)
        assert running.process is not None
        return running.process

    def _start(self, running: _Running) -> None:
        service = running.service
        # Its own session: Ctrl-C in the terminal reaches the supervisor only, which stops each child in order.
        log = open_log(service.log) if service.log is not None else None
        try:
            running.process = subprocess.Popen(
                list(service.command), env=None if service.env is None else dict(service.env), cwd=service.cwd,
                start_new_session=True, stdout=log, stderr=None if log is None else subprocess.STDOUT,
                preexec_fn=functools.partial(_prepare_child, service.niceness),
            )
        finally:
            if log is not None:
                log.close()  # the child holds its own copy
        running.started_at = time.monotonic()
        running.start_at = None

    def poll(self) -> None:
        """Report and schedule the restart of every service that exited; start those whose back-off is over."""
        if self._stopped:
            return
        now = time.monotonic()
        for running in self._running:
            process = running.process
            if process is not None and process.poll() is not None:
                self._exited(running, process, now)
            elif running.start_at is not None and now >= running.start_at:
                running.restarts += 1
                self._start(running)
                assert running.process is not None
                self._report({"event": "restarted", "service": running.service.name, "restart": running.restarts,
                              "pid": running.process.pid})

    def _exited(self, running: _Running, process: subprocess.Popen[bytes], now: float) -> None:
        kill_group(process)  # a worker's pool process must not go on with a unit that its restart re-runs
        uptime = now - running.started_at
        running.failures_in_row = 1 if uptime >= self.stable_after_s else running.failures_in_row + 1
        delay = min(self.backoff_max_s, self.backoff_first_s * 2 ** (running.failures_in_row - 1))
        running.process = None
        running.start_at = now + delay
        self._report({
            "event": "exited", "service": running.service.name, "code": process.returncode,
            "uptime_s": round(uptime, 1), "restart": running.restarts + 1, "delay_s": delay,
            "failures_in_row": running.failures_in_row, "failing": running.failures_in_row >= self.failing_after,
        })

    def stop(self, *, grace_s: float) -> None:
        """Stop every service (see `stop_processes`; those that stop last afterwards) and start none again."""
        self._stopped = True
        for last in (False, True):
            stop_processes([r.process for r in self._running if r.process is not None and r.service.stops_last == last],
                           grace_s=grace_s)
