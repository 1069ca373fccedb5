"""``manage.py telemetry_compact``: compact old telemetry now (`webapp.dashboards.compaction`), and say what went.

The ingest (`hydra_ingest`) does the same a little at a time; this command does it all at once, for a first
compaction of a large database or from a scheduler of one's own."""

from __future__ import annotations

import datetime
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.config import TELEMETRY_KEEP_DAYS_MINIMUM
from webapp.dashboards.compaction import telemetry_compact


class Command(BaseCommand):
    help = ("Compact the telemetry of trials that ended more than HYDRA_TELEMETRY_KEEP_DAYS days ago to what the "
            "dashboards draw of it, and print how many rows were removed.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than-days", type=int, metavar="N",
                            help="Compact telemetry older than N days (default: HYDRA_TELEMETRY_KEEP_DAYS; at least "
                                 f"{TELEMETRY_KEEP_DAYS_MINIMUM}).")
        parser.add_argument("--dry-run", action="store_true", help="Count what would be removed; remove nothing.")

    def handle(self, *args: Any, older_than_days: int | None, dry_run: bool, **options: Any) -> None:
        days = settings.HYDRA.telemetry_keep_days if older_than_days is None else older_than_days
        if days is None:
            raise CommandError("HYDRA_TELEMETRY_KEEP_DAYS is off; give --older-than-days N to compact anyway.")
        if days < TELEMETRY_KEEP_DAYS_MINIMUM:
            raise CommandError(f"--older-than-days {days} is too short; the lab queue page shares out the last "
                               f"week's device time from the unit spans: give at least {TELEMETRY_KEEP_DAYS_MINIMUM}.")
        result = telemetry_compact(older_than=datetime.timedelta(days=days), dry_run=dry_run)
        verb = "would remove" if dry_run else "removed"
        self.stdout.write(f"telemetry older than {days} days: {result.trials} trials, {verb} {result.steps} step "
                          f"metrics, {result.spans} unit spans and {result.samples} device samples.")
