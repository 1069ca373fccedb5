"""The web worker's Celery app: Django-aware tasks on one queue per host, ``hydra.<HYDRA_HOST_ID>.web``.

It is a second app beside the device workers' (`worker.celery_app`) because its tasks use the ORM, and the
device workers run without Django. The two never meet on the shared broker: this app's tasks go only to
its own queue (`web_queue`), which no device worker consumes, and its control messages use their own
exchange, so the device workers' ``hydra_device`` broadcast is answered by device workers alone.

Tasks are idempotent (their state lives in the database and files are renamed into place), so a message is
acknowledged only once its task has run: a worker killed midway leaves it to be run again. A task whose pool
process dies in it runs once more, a few seconds later, and its work fails when that process dies too
(`task_limits`): a task that always kills its process must not occupy the worker for ever.

``manage.py hydra_web_worker`` starts the worker; pages send it work through `webapp.background.outbox`.
Every Redis command of this app, a page's send as the worker's own, gives up after ``SEND_TIMEOUT_S``: a
Redis that accepts connections but never answers would otherwise hold a request for ever.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from django.conf import settings

# Before the app is made: Celery installs its Django fix-up (setup in the worker, connections closed around
# each task, `delay_on_commit`) only when it finds the settings module.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
app = Celery("hydra-web")
SEND_TIMEOUT_S = 3.0  # Redis answers in milliseconds; the worker's blocking reads wait 1 s (kombu's brpop_timeout)


def web_queue(host_id: str | None = None) -> str:
    """The queue of `host_id`'s web worker (default: this host's, read when called)."""
    return f"hydra.{host_id or settings.HYDRA.worker.host_id}.web"


def _route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> dict[str, str]:
    return {"queue": web_queue()}


app.conf.update(
    broker_url=settings.HYDRA.worker.redis_url,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"socket_timeout": SEND_TIMEOUT_S, "socket_connect_timeout": SEND_TIMEOUT_S},
    task_routes=(_route,),
    task_default_queue=web_queue(),
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_retry_on_worker_lost=True,
    task_annotations={"*": {"max_retries": 1, "default_retry_delay": 5}},
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    control_exchange="hydra-web",
)
app.autodiscover_tasks()

