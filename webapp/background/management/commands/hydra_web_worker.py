"""``manage.py hydra_web_worker``: the web worker, which runs the pages' background work (`webapp.background`)."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from webapp.background.celery_app import app, web_queue
from webapp.background.task_limits import limit_task_memory


class Command(BaseCommand):
    help = "Run the web worker: tokenize uploads, pack models for download, plan large sweeps."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=2, help="Tasks run at once (default 2).")
        parser.add_argument("--loglevel", default="INFO", help="Celery log level (default INFO).")

    def handle(self, *args: Any, concurrency: int, loglevel: str, **options: Any) -> None:
        host = settings.HYDRA.worker.host_id
        # One compute thread per task (unless the operator says otherwise): the cores belong to the device
        # workers pinned to them, and a generation whose threads wait on each other's busy cores ran many
        # times slower than one on a single thread. Set before the pool processes import torch.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        limit = limit_task_memory(app)
        self.stdout.write(f"hydra: each web task may take {limit >> 20:,} MB of memory (HYDRA_WEB_TASK_MEMORY_MB)")
        app.worker_main([
            "worker", "--hostname", f"web@{host}", "--queues", web_queue(host), "--concurrency", str(concurrency),
            "--pool", "prefork", "--without-gossip", "--without-mingle", "--loglevel", loglevel,
        ])
