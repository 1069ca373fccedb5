"""A Redis server of a test's own, which the test may kill, restart and empty: never the shared one.

It keeps an append-only file (``appendfsync everysec``, what `make run` sets up) in its directory, so that a
restart after ``kill -9`` finds what was written up to about a second before.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

START_TIMEOUT_S = 20.0


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateRedis:
    """``redis-server`` on a free port with its files under `root`; `start` it, then `kill` and `start` again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 -- the server writes to it until it ends
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.root),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--protected-mode", "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        client = self.client()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if client.ping():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{self.logs()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """``kill -9`` the server: whatever its append-only file did not hold yet is lost."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=5)

    def logs(self) -> str:
        path = self.root / "redis.log"
        return path.read_text()[-3000:] if path.exists() else ""
