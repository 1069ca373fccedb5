"""Start one Celery worker process per device of this host: ``python -m worker.launch``.

Each worker has concurrency 1, is named ``<device>@<host>`` and is pinned to its device through its
environment (`Device.worker_env`). ``--device cpu:0`` starts that one worker in the foreground (``exec``), as
a lab's process manager (systemd, docker compose) would. SIGINT, SIGTERM and SIGHUP stop every worker this command
started; it waits for them, so nothing is left running.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from worker import config as worker_config
from worker.devices import Device, device_queue, host_devices, host_queue_name, worker_node
from worker.processes import StopSignals, stop_processes, stop_with_parent

STOP_GRACE_S = 20.0


def worker_command(device: Device, host_id: str, *, loglevel: str) -> list[str]:
    """The command line of the Celery worker bound to `device`."""
    return [
        sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
        "--hostname", worker_node(device.name, host_id),
        "--concurrency", "1",
        "--pool", "prefork",
        "--queues", ",".join(worker_queues(device, host_id)),
        "--without-gossip",
        "--without-mingle",  # mingle waits a second at start to sync revoked tasks; Hydra revokes none
        "--loglevel", loglevel,
    ]


def worker_queues(device: Device, host_id: str) -> list[str]:
    """Queues a device worker consumes: its own, its host's, and the shared default one."""
    return [device_queue(host_id, device.name), host_queue_name(host_id), "celery"]


def run_all(devices: Sequence[Device], host_id: str, *, loglevel: str) -> int:
    """Run a worker per device until one exits or we are told to stop; return an exit status."""
    processes: list[subprocess.Popen[bytes]] = []
    stop = StopSignals()
    try:
        for device in devices:
            env = {**os.environ, **device.worker_env()}
            # A new session: Ctrl-C in the terminal reaches this launcher only, which then stops the
            # workers in order (Celery's warm shutdown), instead of every process at once.
            processes.append(
                subprocess.Popen(worker_command(device, host_id, loglevel=loglevel), env=env, start_new_session=True,
                                 preexec_fn=stop_with_parent)
            )
            print(f"hydra: worker {device.name}@{host_id} started (pid {processes[-1].pid})", flush=True)
        while not stop.requested:
            exited = [p for p in processes if p.poll() is not None]
            if exited:
                print(f"hydra: worker pid {exited[0].pid} exited with {exited[0].returncode}", flush=True)
                return exited[0].returncode or 1
            time.sleep(0.5)
        return 0
    finally:
        stop_processes(processes, grace_s=STOP_GRACE_S)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="start only this device's worker, in the foreground (cpu:N or cuda:N)")
    parser.add_argument("--loglevel", default="INFO", help="Celery log level (default INFO)")
    args = parser.parse_args(argv)

    try:
        config = worker_config.current()
    except worker_config.ConfigError as error:
        parser.error(str(error))
    try:
        devices = host_devices(config.devices)
    except ValueError as error:
        parser.error(str(error))
    if args.device:
        matching = [d for d in devices if d.spec == args.device]
        if not matching:
            parser.error(f"--device {args.device} is not one of this host's devices: {[d.spec for d in devices]}")
        device = matching[0]
        os.environ.update(device.worker_env())
        command = worker_command(device, config.host_id, loglevel=args.loglevel)
        os.execv(command[0], command)
    return run_all(devices, config.host_id, loglevel=args.loglevel)


if __name__ == "__main__":
    sys.exit(main())
