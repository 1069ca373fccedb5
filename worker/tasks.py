"""Celery adapters of the scheduler: the device loop task, and the worker signals that start and stop it.

A device worker (HYDRA_WORKER_DEVICE set, see worker/launch.py) sends itself one ``device_loop`` task when
it is ready, on its own queue; the loop runs in the worker's pool process until the worker shuts down. The
worker's main process stays free to answer ping and inspect while units run. Submitting and controlling
trials needs no task: it is a Redis script (`worker.api`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid

import psutil
import redis
from celery import signals

from worker import config
from worker.api import host_queue
from worker.celery_app import app
from worker.devices import device_queue

log = logging.getLogger(__name__)
STOP_WATCH_S = 1.0  # while shutting down, how often the worker checks that Redis still answers
STOP_KILL_S = 10.0  # with Redis gone, how long the device loop's process has to end on SIGTERM before SIGKILL


def _device() -> tuple[str, int] | None:
    """(kind, index) of the device this worker is bound to, or None for a worker bound to none."""
    spec = config.current().worker_device
    if spec is None:
        return None
    kind, index = spec.split(":")
    return kind, int(index)


# acks_late + reject_on_worker_lost: if the pool process is killed, the message goes back and the worker's
# new pool process restarts the loop. A Redis outage retries the loop instead of ending it.
@app.task(
    name="hydra.device_loop", ignore_result=True, acks_late=True, reject_on_worker_lost=True,
    autoretry_for=(redis.ConnectionError, redis.TimeoutError), retry_backoff=True, max_retries=None,
)
def device_loop(epoch: str) -> None:
    """Run this worker's device loop until the worker stops or a newer loop (epoch) replaces it."""
    import torch

    from worker.devices import cpu_cores
    from worker.scheduling.device_loop import DeviceLoop, DeviceLoopConfig
    from worker.scheduling.engine_runner import EngineRunner, torch_device
    from worker.scheduling.synthetic import SyntheticRunner
    from worker.scheduling.telemetry import DeviceSampler

    bound = _device()
    if bound is None:
        raise RuntimeError("device_loop ran on a worker bound to no device (HYDRA_WORKER_DEVICE is unset).")
    kind, index = bound
    host_cores = None
    if kind == "cpu" and hasattr(os, "sched_setaffinity"):  # Linux; elsewhere the thread budget alone binds
        host_cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpu_cores(index, torch.get_num_threads(), host_cores))
    queue = host_queue(config.current())
    settings = config.current()
    settings.spill_dir.mkdir(parents=True, exist_ok=True)
    runners = {
        # A CPU device of one core has no second core to load the next shard on while a unit computes.
        "engine": EngineRunner(spill_dir=settings.spill_dir, device=torch_device(kind),
                               prefetch=kind == "cuda" or torch.get_num_threads() > 1,
                               checkpoint_dir=settings.data_dir / "checkpoints",
                               fault_oom_above_bytes=settings.fault_oom_above_bytes, fault=settings.fault,
                               studies=queue.client, host_cores=host_cores),
        "synthetic": SyntheticRunner(),
    }
    name = f"{kind}{index}"
    sampler = DeviceSampler(queue.client, queue.host_id, device=name, kind=kind, index=index,
                            threads=torch.get_num_threads())
    sampler.start()
    try:
        DeviceLoop(queue=queue, runners=runners, config=DeviceLoopConfig(device=name, epoch=epoch)).run()
    finally:
        sampler.stop()


@signals.worker_ready.connect
def start_device_loop(**kwargs: object) -> None:
    bound = _device()
    if bound is None:
        return
    name = f"{bound[0]}{bound[1]}"
    epoch = uuid.uuid4().hex
    queue = host_queue(config.current())
    queue.configure(capacity_bytes=config.spill_capacity(config.current()))
    queue.device_start(name, epoch)
    queue.register_host()
    device_loop.apply_async(args=[epoch], queue=device_queue(queue.host_id, name))
    log.info("device loop of %s requested (epoch %s)", name, epoch)


@signals.worker_shutting_down.connect
def stop_device_loop(**kwargs: object) -> None:
    """Ask the device loop to end at its next unit boundary, through Redis, where it looks between units.

    The loop hears of the stop only through Redis: while Redis cannot be reached it surveys on, waiting for it,
    and the warm shutdown would wait for the loop for ever (Redis killed, or stopped together with the worker when
    their launcher died). So when the stop cannot be written, or Redis stops answering before the loop has ended,
    the pool process running the loop is ended instead. Without Redis it could report nothing anyway; a unit it
    was running runs again, from its last commit, once Redis is back."""
    bound = _device()
    if bound is None:
        return
    name = f"{bound[0]}{bound[1]}"
    queue = host_queue(config.current())
    with contextlib.suppress(redis.RedisError):  # the watch finds Redis gone at once and ends the loop
        queue.device_stop(name)
    threading.Thread(target=_end_loop_if_redis_goes, args=(queue.client, name), daemon=True,
                     name="hydra-stop-watch").start()


def _end_loop_if_redis_goes(client: redis.Redis, device: str) -> None:
    """Until this worker's pool process has ended: end it once Redis stops answering. SIGTERM again every
    ``STOP_WATCH_S``, since one can land where Python drops the exit it raises (in a finalizer, as the pool
    process starts the loop's task), then SIGKILL after ``STOP_KILL_S``."""
    gone_since: float | None = None
    while children := _pool_processes():
        if gone_since is None:
            try:
                client.ping()
            except redis.RedisError as error:
                gone_since = time.monotonic()
                log.warning("device %s: Redis unreachable while shutting down (%s); ending the device loop's "
                            "process", device, error)
        if gone_since is not None:
            kill = time.monotonic() - gone_since >= STOP_KILL_S
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess):
                    if kill:
                        child.kill()
                    else:
                        child.terminate()
        time.sleep(STOP_WATCH_S)


def _pool_processes() -> list[psutil.Process]:
    """This worker's live pool processes (the one running the device loop; not those already exited)."""
    alive = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
    return alive


