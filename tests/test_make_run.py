"""`make run` on this machine: a login page, a worker online, the URL and the login printed last with the
services' output in their log files, and nothing left running after Ctrl-C, a closed terminal or its supervisor
killed; and a stack whose Redis, a worker and the ingest are killed in turn, each started again, finishes its
experiment."""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.processes  # `make run`'s services, killed in turn


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


def private_redis_url() -> str:
    """A free port for the Redis `make run` starts without REDIS_URL (HYDRA_REDIS_PORT): its own, never a
    Redis that `make test` or a developer's `make run` has on the default port."""
    return f"redis://127.0.0.1:{free_port()}/0"


def web_worker_answers(redis_url: str, host_id: str) -> bool:
    """Whether the web worker of `host_id` answers a ping through make run's Redis (it reconnected)."""
    app = Celery(broker=redis_url)
    app.conf.control_exchange = "hydra-web"  # the web worker's own (webapp/background/celery_app.py)
    try:
        return bool(app.control.ping(destination=[f"web@{host_id}"], timeout=1.0))
    finally:
        app.close()


def _as_in_a_terminal() -> None:
    """In `make run`'s process, before it starts: SIGHUP as a terminal session has it. A test run under nohup
    (a CI runner's) ignores SIGHUP, and `make run` keeps ignoring a SIGHUP that its starter ignored."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


# Ctrl-C in the terminal, the terminal closed (or the SSH session dropped), and make and the stack's supervisor
# killed outright (SIGKILL: an IDE's stop button, the out-of-memory killer): the process group in the foreground
# gets the signal; the services run in sessions of their own.
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=["ctrl-c", "terminal-closed", "supervisor-killed"])
def test_it_serves_login_and_a_worker_then_stops_everything_on_ctrl_c_or_when_its_terminal_closes(
        tmp_path, stop_signal):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in {"REDIS_URL", "DATABASE_URL"}}
    # A fresh data folder: new SQLite database, demo user, and a private Redis that make run must start.
    redis_url = private_redis_url()
    env |= {"HYDRA_DATA_DIR": str(tmp_path / "var"), "HYDRA_HOST_ID": "makerun",
            "HYDRA_REDIS_PORT": str(urllib.parse.urlsplit(redis_url).port)}
    log = (tmp_path / "make-run.log").open("w")
    make = subprocess.Popen(
        ["make", "run", f"PORT={port}"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_as_in_a_terminal,
    )
    seen: set[int] = set()
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 150
        workers: list[dict] = []
        # The launcher starts one worker per device; they register in any order, so wait for cpu:0's own.
        while time.monotonic() < deadline and "cpu:0" not in {w["device"] for w in workers}:
            assert make.poll() is None, (tmp_path / "make-run.log").read_text()
            seen |= descendants(make.pid)
            try:
                status, _ = get(f"{base}/health")  # up: the web server, its database and its Redis answer
                workers = workers_online(redis_url, "makerun") if status == 200 else []
            except OSError:
                pass
            time.sleep(1)
        assert "cpu:0" in {w["device"] for w in workers}, (tmp_path / "make-run.log").read_text()

        status, page = get(f"{base}/login/")
        assert status == 200 and 'name="password"' in page
        _the_terminal_ends_with_the_url_and_the_login(tmp_path / "make-run.log", tmp_path / "var", base)
        seen |= descendants(make.pid)
        commands = [" ".join(psutil.Process(pid).cmdline()) for pid in seen if psutil.pid_exists(pid)]
        assert any("hydra_web_worker" in command for command in commands), commands  # the pages' background work
    finally:
        os.killpg(make.pid, stop_signal)
        try:
            make.wait(timeout=60)
        except subprocess.TimeoutExpired:  # leave nothing running for the tests after this one
            for pid in seen | descendants(make.pid) | {make.pid}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise
        finally:
            log.close()
    assert len(seen) >= 4  # devstack, redis-server, the web server, the launcher and its workers

    def left() -> list[int]:
        return [pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]

    deadline = time.monotonic() + 60  # the supervisor stops them in order, each with its grace period
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left() == [], (f"still running after {stop_signal.name}: {[psutil.Process(p).cmdline() for p in left()]}\n"
                          + (tmp_path / "make-run.log").read_text())


def _the_terminal_ends_with_the_url_and_the_login(terminal: Path, data_dir: Path, base: str) -> None:
    """What `make run` printed: a few lines, the last of them where Hydra is and how to log in; the services'
    own output (Celery's banners, the web server's requests) is in their log files."""
    printed = terminal.read_text()
    login = (data_dir / "demo-login.txt").read_text().split()
    last = [line for line in printed.splitlines() if line.strip()][-6:]
    assert f"hydra: Hydra is running at {base}/" in last, printed
    assert f"hydra: log in as {login[0]} / {login[1]}" in last, printed
    assert "@makerun ready" not in printed and "GET /health" not in printed and len(printed.splitlines()) < 20, printed
    logs = data_dir / "logs"
    assert "cpu0@makerun ready" in (logs / "worker-cpu0.log").read_text()
    assert "GET /health" in (logs / "web-server.log").read_text()
    assert {"ingest.log", "web-worker.log"} <= {path.name for path in logs.iterdir()}


# Run inside the stack's own settings (`manage.py shell`): a tiny dataset and a sweep of two micro GPT-2 trials
# for the demo team, launched; and a staff user to read the health details.
LAUNCH = """
from django.contrib.auth import get_user_model
from webapp.accounts.models import Team
from webapp.experiments.services import experiment_launch
from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.factories import make_experiment

team = Team.objects.get(name="Demo lab")
demo = get_user_model().objects.get(username="demo")
experiment = make_experiment(team, make_dataset(team), n_trials=2, budget=STEPS, eval_every=STEPS)
experiment_launch(experiment=experiment, actor=demo)
get_user_model().objects.create_user(username="oscar", password="PASSWORD", is_staff=True)
print("launched", experiment.pk)
"""
STEPS = 150
STAFF_PASSWORD = "correct-horse-battery-staple"


class Stack:
    """`make run` started with its own data folder and private Redis, as a user runs it."""

    def __init__(self, tmp_path: Path, host_id: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.data_dir = tmp_path / "var"
        self.host_id = host_id
        self.redis_url = private_redis_url()
        self.env = {key: value for key, value in os.environ.items() if key not in {"REDIS_URL", "DATABASE_URL"}}
        self.env |= {"HYDRA_DATA_DIR": str(self.data_dir), "HYDRA_HOST_ID": host_id, "HYDRA_DEVICES": "cpu:2",
                     "HYDRA_SPILL_DIR": str(tmp_path / "spill"),
                     "HYDRA_REDIS_PORT": str(urllib.parse.urlsplit(self.redis_url).port)}
        self.log_path = tmp_path / "make-run.log"
        self.log = self.log_path.open("w")
        self.make = subprocess.Popen(["make", "run", f"PORT={self.port}"], cwd=ROOT, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.seen: set[int] = set()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:]

    def wait(self, what: str, done, timeout_s: float = 120.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.make.poll() is None, self.output()
            self.seen |= descendants(self.make.pid)
            try:
                result = done()
            except (OSError, redis.RedisError, OperationalError):  # a service not (or no longer) answering
                result = None
            if result:
                return result
            time.sleep(1)
        raise AssertionError(f"timed out waiting for {what}\n{self.output()}")

    def service_pid(self, marker: str) -> int:
        """The pid of the one process `make run` supervises whose command line contains `marker`."""
        devstack = next(p for p in psutil.Process(self.make.pid).children(recursive=True)
                        if "devstack.py" in " ".join(p.cmdline()))
        pids = [p.pid for p in devstack.children() if marker in " ".join(p.cmdline())]
        assert len(pids) == 1, (marker, [p.cmdline() for p in devstack.children()])
        return pids[0]

    def events(self) -> list[dict[str, object]]:
        path = self.data_dir / "service-events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def restarted(self, service: str) -> bool:
        return any(e["event"] == "restarted" and e["service"] == service for e in self.events())

    def units_done(self) -> dict[str, int]:
        """Each trial of the stack's queue (in its Redis) with the units it has done. Only the trials' own hashes:
        a trial's `trial:<id>:leases` exists only while a unit of it is in flight."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True, socket_timeout=5)
        try:
            prefix = f"hydra:{self.host_id}:trial:"
            return {key.removeprefix(prefix): int(client.hget(key, "units_done") or 0)
                    for key in client.scan_iter(match=f"{prefix}*") if ":" not in key.removeprefix(prefix)}
        finally:
            client.close()

    def trials(self) -> list[tuple[str, int]]:
        with sqlite3.connect(f"file:{self.data_dir / 'hydra.sqlite3'}?mode=ro", uri=True, timeout=10) as db:
            return db.execute("SELECT status, step FROM experiments_trial ORDER BY number").fetchall()

    def staff_get(self, path: str) -> str:
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login = opener.open(f"{self.base}/login/", timeout=10).read().decode()  # sets the CSRF cookie
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login).group(1)
        form = urllib.parse.urlencode({"username": "oscar", "password": STAFF_PASSWORD,
                                       "csrfmiddlewaretoken": token}).encode()
        login_url = f"{self.base}/login/"
        opener.open(urllib.request.Request(login_url, data=form, headers={"Referer": login_url}), timeout=10)
        try:
            return opener.open(f"{self.base}{path}", timeout=10).read().decode()
        except urllib.error.HTTPError as error:  # 503 while a service is down still has the page
            return error.read().decode()

    def stop(self) -> list[str]:
        """Ctrl-C; the command lines of processes still running afterwards."""
        self.seen |= descendants(self.make.pid)
        os.killpg(self.make.pid, signal.SIGINT)
        self.make.wait(timeout=90)
        self.log.close()
        time.sleep(0.5)
        return [" ".join(psutil.Process(p).cmdline()) for p in self.seen
                if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_redis_a_worker_and_the_ingest_killed_in_turn_come_back_and_the_experiment_finishes(tmp_path):
    stack = Stack(tmp_path, "makerun-durable")
    try:
        stack.wait("the stack", lambda: get(f"{stack.base}/health")[0] == 200
                   and len(workers_online(stack.redis_url, stack.host_id)) == 2)
        script = LAUNCH.replace("STEPS", str(STEPS)).replace("PASSWORD", STAFF_PASSWORD)
        launch = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, capture_output=True,
                                text=True, env=stack.env | {"REDIS_URL": stack.redis_url}, timeout=120)
        assert "launched" in launch.stdout, launch.stderr
        stack.wait("a trial training", lambda: any(status == "running" and step > 0 for status, step in stack.trials()))

        for service, marker in (("redis-server", "redis-server"), ("worker cpu0", "--hostname cpu0@"),
                                ("ingest", "hydra_ingest")):
            before = stack.units_done()
            client = redis.Redis.from_url(stack.redis_url, decode_responses=True)
            client.set("test:last-write", "acknowledged")  # what only the append-only file keeps across a kill
            os.kill(stack.service_pid(marker), signal.SIGKILL)
            stack.wait(f"{service} started again", lambda service=service: stack.restarted(service))
            if service == "redis-server":  # it loaded its append-only file: every trial, none set back
                after = stack.wait("Redis answering", stack.units_done)
                assert after.keys() == before.keys() and all(after[t] >= before[t] for t in before), (before, after)
                assert client.get("test:last-write") == "acknowledged"
            client.close()
        stack.wait("the workers online", lambda: len(workers_online(stack.redis_url, stack.host_id)) == 2)
        stack.wait("the web worker back on Redis", lambda: web_worker_answers(stack.redis_url, stack.host_id))
        trials_then = stack.trials()

        status, public = get(f"{stack.base}/health")
        assert status == 200
        assert re.fullmatch(r"up\ningest exited with -9 \(SIGKILL\) at \d\d:\d\d:\d\d, restarted \(1st restart\); "
                            r"3 exits since make run started\n", public), public
        details = stack.staff_get("/health/")
        for service in ("redis-server", "worker cpu0", "ingest"):
            assert re.search(rf"{service} exited with -9 \(SIGKILL\) at [\d:]+, restarted \(1st restart\)", details), (
                service, details)

        finished = stack.wait("the experiment finished", lambda: all(s in {"finished", "failed", "cancelled"}
                                                                     for s, _ in stack.trials()), timeout_s=600)
        assert stack.trials() == [("finished", STEPS), ("finished", STEPS)], (trials_then, finished, stack.output())
        assert "redis-server exited with -9 (SIGKILL); restarting it in 1 s (1st restart)" in stack.output()
    finally:
        left = stack.stop()
    assert left == [], f"still running after Ctrl-C: {left}"
    assert stack.events()[-1]["event"] == "stopped"
