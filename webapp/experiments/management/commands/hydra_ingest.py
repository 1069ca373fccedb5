"""``manage.py hydra_ingest``: copy telemetry from Redis streams into the database, every second, bring the
trials' rows and the queue of this web app's host back in line (`webapp.experiments.reconcile`), and send the
web worker's pending work again where its message never left or was lost (`webapp.background.reconcile`).

The reconciler has one owner: an ingest reconciles only while it holds the host's ``reconciler`` role
(`queue_client.role_take`), renewed at every pass; a second ingest of the same host drains telemetry but
leaves the reconciling to the first, and takes it over once the first stops renewing (`ROLE_TTL_S`).

Every pass may also compact old telemetry (`webapp.dashboards.compaction.Schedule`: at most every ten minutes
and two seconds at a time, while ``HYDRA_TELEMETRY_KEEP_DAYS`` is not off)."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError

from webapp.background.reconcile import web_work_reconcile
from webapp.dashboards.compaction import Schedule
from webapp.experiments.ingest import telemetry_ingest
from webapp.experiments.reconcile import trial_hosts, trials_reconcile
from webapp.queue_client import SchedulerUnavailable, heartbeat_set, hosts_known, role_take

ROLE_TTL_S = 10.0  # an ingest that stopped renewing the reconciler role loses it after this long


class Command(BaseCommand):
    help = ("Drain the hosts' telemetry streams (steps, evals, spans, samples, trial events) into the database; "
            "submit launched trials not submitted yet and cancel queued trials whose records are gone; send the web "
            "worker's pending work again.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Drain what is there now, then exit.")
        parser.add_argument(
            "--host", action="append", dest="hosts", metavar="HOST_ID",
            help="A host whose streams to drain (repeatable); default: every host whose device workers started "
                 "against this Redis, and this one (HYDRA_HOST_ID).",
        )
        parser.add_argument("--interval", type=float, default=1.0, help="Seconds between passes (default 1).")

    def handle(self, *args: Any, once: bool, hosts: list[str] | None, interval: float, **options: Any) -> None:
        given = hosts
        owner = f"ingest@{socket.gethostname()}:{os.getpid()}"
        stop = threading.Event()
        compaction = Schedule()
        if not once:
            # A process manager stops us with SIGTERM: finish the current batch, whose transaction is atomic.
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
        while True:
            try:  # hosts whose workers start later are drained from the pass after
                hosts = given or sorted(set(hosts_known()) | trial_hosts())
            except SchedulerUnavailable as error:
                self.stderr.write(f"hydra_ingest: Redis unavailable ({error}); retrying in {interval} s")
                hosts = [settings.HYDRA.worker.host_id]
            for host in hosts:
                try:
                    read = telemetry_ingest(host_id=host)
                    if role_take(  # one ingest reconciles each host's queue with the database
                            role="reconciler", owner=owner, ttl_s=max(ROLE_TTL_S, 3 * interval), host_id=host):
                        reconciled = trials_reconcile(host_id=host)
                        read |= {"submitted": len(reconciled.submitted), "cancelled": len(reconciled.cancelled),
                                 "resubmitted": len(reconciled.resubmitted), "ended": len(reconciled.ended)}
                        if host == settings.HYDRA.worker.host_id:  # the web worker's work is the web app's
                            web_work = web_work_reconcile()
                            read |= {"web work sent": web_work.sent, "web work failed": web_work.failed}
                    heartbeat_set(name="ingest", host_id=host)
                except (redis.ConnectionError, redis.TimeoutError, SchedulerUnavailable) as error:  # next pass
                    self.stderr.write(f"hydra_ingest: Redis unavailable ({error}); retrying in {interval} s")
                    continue
                if any(read.values()):
                    self.stdout.write(f"hydra_ingest {host}: " + ", ".join(f"{k} {v}" for k, v in read.items()))
            try:
                compacted = compaction.run_if_due()
            except DatabaseError as error:  # the ingest goes on; the next compaction starts where this one stopped
                self.stderr.write(f"hydra_ingest: telemetry compaction failed ({error})")
            else:
                if compacted and (compacted.trials or compacted.samples):
                    self.stdout.write(f"hydra_ingest: {compacted}")
            if once or stop.wait(interval):
                break
