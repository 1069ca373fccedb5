"""The Celery application shared by the web process (to send tasks) and the device workers.

Broker and result backend come from Django settings (``CELERY_*``), which read ``REDIS_URL`` once.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.worker.control import inspect_command

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("hydra")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["worker"])


@inspect_command()
def hydra_device(state: object) -> dict[str, object]:
    """Answer ``broadcast("hydra_device")`` with the device this worker process is bound to."""
    from django.conf import settings

    return {
        "device": settings.HYDRA.worker_device,
        "host": settings.HYDRA.host_id,
        "pid": os.getpid(),
    }
