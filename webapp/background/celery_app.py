"""The web worker's Celery app: Django-aware tasks on one queue per host, ``hydra.<HYDRA_HOST_ID>.web``.

It is a second app beside the device workers' (`worker.celery_app`) because its tasks use the ORM, and the
device workers run without Django. The two never meet on the shared broker: this app's tasks go only to
its own queue (`web_queue`), which no device worker consumes, and its control messages use their own
exchange, so the device workers' ``hydra_device`` broadcast is answered by device workers alone.

Tasks are idempotent (their state lives in the database and files are renamed into place), so a message is
acknowledged only once its task has run: a worker killed midway leaves it to be run again.

``manage.py hydra_web_worker`` starts the worker; pages enqueue work with `enqueue_on_commit`.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from django.conf import settings
from django.db import transaction

# Before the app is made: Celery installs its Django fix-up (setup in the worker, connections closed around
# each task, `delay_on_commit`) only when it finds the settings module.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
app = Celery("hydra-web")


def web_queue(host_id: str | None = None) -> str:
    """The queue of `host_id`'s web worker (default: this host's, read when called)."""
    return f"hydra.{host_id or settings.HYDRA.worker.host_id}.web"


def _route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> dict[str, str]:
    return {"queue": web_queue()}


app.conf.update(
    broker_url=settings.HYDRA.worker.redis_url,
    broker_connection_retry_on_startup=True,
    task_routes=(_route,),
    task_default_queue=web_queue(),
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    control_exchange="hydra-web",
)
app.autodiscover_tasks()


def enqueue_on_commit(task_name: str, *args: Any) -> None:
    """Send the task `task_name` to this host's web worker once the current transaction commits (at once
    outside one), so that the worker finds the rows the task is about."""
    transaction.on_commit(lambda: app.send_task(task_name, args=args, queue=web_queue()))
