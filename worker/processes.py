"""Stopping the child processes that Hydra's launchers start, so that nothing is left running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable


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
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
