"""`make run` on this machine: a login page, a worker online, and nothing left running after Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from celery import Celery

ROOT = Path(__file__).resolve().parents[1]
# Without REDIS_URL, `make run` starts its own Redis on this port (PRIVATE_REDIS_PORT in scripts/devstack.py).
PRIVATE_REDIS_URL = "redis://127.0.0.1:6390/0"
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def workers_online(redis_url: str, host_id: str) -> list[dict[str, object]]:
    """The device workers of `host_id` that answer Celery's broadcast on `redis_url` (what the staff-only
    health page shows)."""
    app = Celery(broker=redis_url)
    try:
        replies = app.control.broadcast("hydra_device", reply=True, timeout=1.0) or []
    finally:
        app.close()
    return [info for reply in replies for info in reply.values() if isinstance(info, dict) and info["host"] == host_id]


def descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def test_it_serves_login_and_a_worker_then_stops_everything_on_ctrl_c(tmp_path):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in {"REDIS_URL", "DATABASE_URL"}}
    # A fresh data folder: new SQLite database, demo user, and a private Redis that make run must start.
    env |= {"HYDRA_DATA_DIR": str(tmp_path / "var"), "HYDRA_HOST_ID": "makerun"}
    log = (tmp_path / "make-run.log").open("w")
    make = subprocess.Popen(
        ["make", "run", f"PORT={port}"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen: set[int] = set()
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 150
        workers: list[dict] = []
        while time.monotonic() < deadline and not workers:
            assert make.poll() is None, (tmp_path / "make-run.log").read_text()
            seen |= descendants(make.pid)
            try:
                status, _ = get(f"{base}/health")  # up: the web server, its database and its Redis answer
                workers = workers_online(PRIVATE_REDIS_URL, "makerun") if status == 200 else []
            except OSError:
                pass
            time.sleep(1)
        assert workers, (tmp_path / "make-run.log").read_text()
        assert {w["device"] for w in workers} >= {"cpu:0"}

        status, page = get(f"{base}/login/")
        assert status == 200 and 'name="password"' in page
        assert "log in as demo" in (tmp_path / "make-run.log").read_text()
        seen |= descendants(make.pid)
        commands = [" ".join(psutil.Process(pid).cmdline()) for pid in seen if psutil.pid_exists(pid)]
        assert any("hydra_web_worker" in command for command in commands), commands  # the pages' background work
    finally:
        os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        make.wait(timeout=60)
        log.close()
    assert len(seen) >= 4  # devstack, redis-server, the web server, the launcher and its workers
    time.sleep(0.5)
    left = [pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"still running after Ctrl-C: {[psutil.Process(p).cmdline() for p in left]}"
