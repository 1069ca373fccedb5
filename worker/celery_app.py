"""The Celery application of the device workers, configured from the workers' own configuration.

The broker is ``REDIS_URL`` (`worker.config`); no Django settings are read, so a GPU server runs workers
without the web app. The web app uses this app only to ask the workers which device each is bound to.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.worker.control import inspect_command

from worker import config

app = Celery("hydra")
app.conf.update(
    broker_url=config.current().redis_url,
    result_backend=config.current().redis_url,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
app.autodiscover_tasks(["worker"])


@inspect_command()
def hydra_device(state: object) -> dict[str, object]:
    """Answer ``broadcast("hydra_device")`` with the device this worker process is bound to."""
    return {"device": config.current().worker_device, "host": config.current().host_id, "pid": os.getpid()}
