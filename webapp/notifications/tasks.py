"""The web worker's notification task (`webapp.background`): deliver one notice to one address or URL."""

from __future__ import annotations

from webapp.background.celery_app import app
from webapp.notifications.delivery import delivery_run
from webapp.notifications.models import Delivery


@app.task(name=Delivery.TASK)
def deliver(delivery_id: int) -> None:
    delivery_run(delivery_id=delivery_id)
