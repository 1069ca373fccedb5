"""The real Hydra stack for browser tests: ``scripts/devstack.py run`` as a user starts it, stopped as Ctrl-C does.

Everything it starts lives in one process group per child under the devstack process; `DevStack.stop` sends
SIGINT to devstack's group (what Ctrl-C in a terminal does), waits, and reports any process still alive.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import psutil
import redis

from worker import api
from worker.config import WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DevStack:
    """``devstack.py run`` on a free port with its own data folder, spill folder and host id (its Redis keys)."""

    def __init__(self, *, root: Path, worker_config: WorkerConfig, devices: str = "cpu:2") -> None:
        self.root = root
        self.worker_config = worker_config  # the test session's: its Redis is the one the stack shares
        self.redis_url = worker_config.redis_url
        self.devices = devices
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.host_id = f"e2e-{uuid.uuid4().hex[:10]}"
        self.data_dir = root / "var"
        self.log_path = root / "devstack.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, psutil.Process] = {}  # every descendant met, kept to check none outlives a stop

    def environment(self) -> dict[str, str]:
        """The stack's environment: a fresh SQLite database in the data folder, whatever database the test
        session itself uses."""
        env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
        return env | {
            "HYDRA_DATA_DIR": str(self.data_dir), "HYDRA_SPILL_DIR": str(self.root / "spill"),
            "HYDRA_HOST_ID": self.host_id, "HYDRA_DEVICES": self.devices, "REDIS_URL": self.redis_url,
            "DEBUG": "1",
        }

    def start(self) -> None:
        """Start the stack and wait until the web server answers and a worker per device is online."""
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                # --verbose: every service's output in this one log, which a failure prints
                [sys.executable, str(ROOT / "scripts" / "devstack.py"), "run", "--port", str(self.port), "--verbose"],
                cwd=ROOT, env=self.environment(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        expected = int(self.devices.split(":")[1])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.web_answers() or len(self.workers()) < expected:
            self.remember_processes()
            if self.process.poll() is not None:
                raise AssertionError(f"devstack exited with {self.process.returncode}\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the stack was not up after {START_TIMEOUT_S:.0f} s\n{self.log()}")
            time.sleep(1.0)
        self.remember_processes()

    def web_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/login/", timeout=10) as response:
                return response.status == 200
        except OSError:  # refused while it starts; urllib's HTTPError is an OSError too
            return False

    def workers(self) -> list[dict[str, object]]:
        """This host's device workers that answer the Celery broadcast every worker on the shared Redis gets."""
        replies = api.workers_online(config=self.worker_config, timeout_s=1.0)
        return [w for w in replies if w.get("host") == self.host_id]

    def trial_spec(self, trial_id: int) -> dict[str, Any]:
        """The engine spec the stack sent for a trial, from its database: server-side facts (where its tokens
        are) that no page shows."""
        from webapp.ground.models import Trial

        with closing(sqlite3.connect(self.data_dir / "hydra.sqlite3")) as database:
            (spec,) = database.execute(f"SELECT spec FROM {Trial._meta.db_table} WHERE id = ?",
                                       (trial_id,)).fetchone()
        return json.loads(spec)

    def demo_login(self) -> tuple[str, str]:
        username, password = (self.data_dir / "demo-login.txt").read_text().split()
        return username, password

    def remember_processes(self) -> None:
        if self.process is None:
            return
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        self.seen |= {child.pid: child for child in children if child.pid not in self.seen}

    def queue_state(self) -> str:
        """Every trial's record in the stack's queue (without its job and plan) and the last events: what a
        failed wait needs to tell a stuck trial from a page that did not show its state."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            prefix = f"hydra:{self.host_id}:"
            lines = []
            for key in sorted(client.scan_iter(match=f"{prefix}trial:*", count=1000)):
                record = {k: v for k, v in client.hgetall(key).items() if k not in ("job", "plan")}
                lines.append(f"{key.removeprefix(prefix)} {record}")
            events = client.xrevrange(f"{prefix}events", count=12)
            lines += [f"event {entry_id} {fields}" for entry_id, fields in reversed(events)]
            return "\n".join(lines)
        except redis.RedisError as error:
            return f"(queue not read: {error})"
        finally:
            client.close()

    def log(self, tail: int = 12_000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def stop(self) -> list[str]:
        """Ctrl-C the stack; return the command lines of processes still running afterwards (none, we hope)."""
        if self.process is None:
            return []
        self.remember_processes()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        deadline = time.monotonic() + 5.0
        left = self._alive()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self._alive()
        commands = []
        for process in left:
            try:
                commands.append(" ".join(process.cmdline()))
                process.kill()  # leave nothing behind for the next test, but report it
            except psutil.NoSuchProcess:
                pass
        self._forget_redis_keys()
        return commands

    def _alive(self) -> list[psutil.Process]:
        """Processes seen earlier that still run (`is_running` also checks the pid was not reused)."""
        alive = []
        for process in self.seen.values():
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.NoSuchProcess:
                pass
        return alive

    def _forget_redis_keys(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        try:
            keys = list(client.scan_iter(match=f"*{self.host_id}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
