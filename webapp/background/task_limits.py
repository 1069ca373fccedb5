"""The memory each of the web worker's task processes may take, so that a task that goes wrong fails alone.

Every team's pages send their work to one web worker. A task that takes memory without bound (a file that
decodes to gigabytes) must fail by itself, with a message, rather than grow until the kernel kills whatever it
picks. `limit_task_memory` sets, for the web worker (``manage.py hydra_web_worker``):

- each pool process may map ``HYDRA_WEB_TASK_MEMORY_MB`` of data (``RLIMIT_DATA``: heap and private memory,
  not the libraries' code nor address space only reserved), a quarter of the host's memory when unset. An
  allocation past it fails, which Python raises in the task as MemoryError;
- a pool process grown past half of that is replaced once its task ends (Celery's
  ``worker_max_memory_per_child``), so that the next task starts with its whole allowance;
- a pool process that dies in a task all the same (native code that aborts when an allocation fails) makes the
  task run once more on a fresh process (``task_retry_on_worker_lost`` in `celery_app`); when that one dies too,
  the task's work fails with a message naming the limit (`work_fail_lost`), and is not sent round again.
"""

from __future__ import annotations

import logging
import os
import resource
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import Celery
from celery.signals import task_failure, worker_process_init
from django.conf import settings

from webapp.background.outbox import FAILED
from webapp.background.reconcile import web_work_models

log = logging.getLogger(__name__)


def task_memory_bytes() -> int:
    """What one task process may map: ``HYDRA_WEB_TASK_MEMORY_MB``, else a quarter of the host's memory."""
    configured = settings.HYDRA.web_task_memory_bytes
    return configured if configured is not None else os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4


def memory_note() -> str:
    """The limit, as the messages of work that ran out of memory name it."""
    return f"{task_memory_bytes() >> 20:,} MB, HYDRA_WEB_TASK_MEMORY_MB"


def limit_task_memory(app: Celery) -> int:
    """Run `app`'s pool processes under the memory limit (see the module); returns it, in bytes. Call before the
    worker starts."""
    limit = task_memory_bytes()
    app.conf.worker_max_memory_per_child = limit // 2 // 1024  # in KiB

    @worker_process_init.connect(weak=False)
    def limit_this_process(**kwargs: Any) -> None:
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        capped = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (capped, hard))

    return limit


@task_failure.connect
def work_fail_lost(sender: Any = None, exception: BaseException | None = None, args: Any = None,
                   **kwargs: Any) -> None:
    """Fail the work of a task whose process died in it on its last try: it would otherwise stay pending until
    the outbox gave up on it, sent round again and again."""
    if not isinstance(exception, WorkerLostError) or not args:
        return
    name = getattr(sender, "name", None)
    model = next((model for model in web_work_models() if name == model.TASK), None)
    if model is None:
        return
    tries = (getattr(sender, "max_retries", 0) or 0) + 1
    failed = model.objects.filter(pk=args[0], status=model.PENDING).update(status=FAILED, message=(
        f"The web worker's process ended while doing this, {tries} times: it may have needed more memory than a "
        f"task may take ({memory_note()}). Ask an administrator to look at the web worker's log. "
        f"{model.RETRY_HINT}"))
    if failed:
        log.warning("%s %s failed: its process died %s times (%s)", model.__name__, args[0], tries, exception)
