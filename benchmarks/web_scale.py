"""How fast the pages a lab opens every day answer with 1,000 trials in 100 experiments of 3 teams, over HTTP,
and whether the queries each page reads stay the same as the lab grows.

Creates a throw-away PostgreSQL database (``hydra_web_scale_<pid>``, on the server DATABASE_URL names, else
the local one; dropped at the end) and migrates it. Seeds it in bulk: 3 teams with a user each, one dataset a
team (the same corpus, so the cross-team board compares them), `--experiments` experiments shared out between
the teams with `--trials` trials in all, each trial with 20 step rows, 4 evaluations (its best validation loss
is the best) and 2 unit spans of the last day. Every trial is sent to a throw-away host's real shard queue
(Redis at ``REDIS_URL``) and all but a tenth of them are planned as a device would (the rest wait to be
planned); one in fifty is paused and two run, one on each of the host's 2 devices; the web app then applies
the scheduler's events, so the database holds the statuses the queue does.

The queries per page are counted in process (Django's test client and ``CaptureQueriesContext``, each page
loaded once before), first when a tenth of the experiments are seeded, then with all of them. Then a real HTTP
server (gunicorn, as deployed: DEBUG off, 1 worker) serves the app, the first team's user is logged in, and
`--repeat` GETs of each page are timed one after another: the experiment list, the page of an experiment of
10 trials, the leaderboard of the team's dataset (its 300-odd trials, a page of them, and each team's best)
and the lab queue page (the 1,000 trials of the host, 50 a page).

The last line is one JSON object: ``{"trials", "experiments", "pages": {name: {"p50_ms", "p99_ms",
"queries"}}, "queries_constant", "target_met"}``. Target: every page p50 under 300 ms and p99 under 1 s, and
the same queries at both sizes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import secrets
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.gunicorn_server import free_port, serve  # noqa: E402 -- Django-free

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(48))  # shared with the server: it reads our session

LOCAL_SERVER = "postgres://postgres@127.0.0.1:5432/postgres"
TEAMS = 3
DEVICES = ("cpu0", "cpu1")
STEPS_PER_TRIAL, EVAL_EVERY, TOTAL_STEPS = 20, 5, 200
BATCH = 5000  # rows per insert
TARGET_P50_MS, TARGET_P99_MS = 300, 1000


def throwaway_database(server_url: str) -> tuple[str, str]:
    """Create ``hydra_web_scale_<pid>`` on the PostgreSQL server of `server_url`; its URL and name."""
    parts = urlsplit(server_url)
    if parts.scheme not in ("postgres", "postgresql"):
        parts = urlsplit(LOCAL_SERVER)
    name = f"hydra_web_scale_{os.getpid()}"
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(parts._replace(path=f"/{name}")), name


def drop_database(database_url: str, name: str) -> None:
    parts = urlsplit(database_url)
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Lab:
    """The seeded teams, users, datasets and experiments, and the host's shard queue they are sent to."""

    def __init__(self, *, queue: Any, rng: random.Random) -> None:
        from django.contrib.auth import get_user_model
        from django.utils import timezone

        from webapp.accounts.models import Membership, Team
        from webapp.datasets.models import Dataset

        self.queue, self.rng, self.now = queue, rng, timezone.now()
        self.teams, self.users, self.datasets = [], [], []
        self.experiments: list[Any] = []
        self.trials = 0
        self.spans = 0
        fingerprint = uuid.uuid4().hex
        for n in range(TEAMS):
            team = Team.objects.create(name=f"Lab {'ABC'[n]}")
            user = get_user_model().objects.create(username=f"scientist-{n}")
            Membership.objects.create(team=team, user=user, role=Membership.Role.OWNER, is_current=True)
            self.datasets.append(Dataset.objects.create(
                team=team, name="sample corpus", source=Dataset.Source.UPLOAD, vocab_size=256, val_fraction=0.1,
                n_bytes=0, n_tokens=0, fingerprint=fingerprint, storage_key=uuid.uuid4().hex,
                status=Dataset.Status.READY))
            self.teams.append(team)
            self.users.append(user)
        for device in DEVICES:
            queue.device_start(device, "e1")
        queue.configure(lease_s=3600)  # the running trials keep their devices for the whole run

    def grow(self, *, experiments: int, trials: int) -> None:
        """Add `experiments` experiments with `trials` trials in all, their telemetry, and send every trial to
        the queue (see the module's docstring for the states)."""
        from django.utils import timezone

        from webapp.experiments.events import trial_events_sync
        from webapp.ground.models import Experiment, Trial

        first = len(self.experiments)
        created = Experiment.objects.bulk_create([
            Experiment(team=self.teams[(first + n) % TEAMS], dataset=self.datasets[(first + n) % TEAMS],
                       name=f"sweep {first + n + 1}", model={"kind": "preset", "preset": "gpt2-micro"},
                       search_space={"lr": {"kind": "logfloat", "low": 1e-4, "high": 1e-2}},
                       strategy=Experiment.Strategy.RANDOM, n_trials=trials // experiments, budget=TOTAL_STEPS,
                       eval_every=EVAL_EVERY, launched=timezone.now())
            for n in range(experiments)
        ])
        self.experiments += created
        rows = []
        for n in range(trials):
            experiment = created[n % experiments]
            rows.append(Trial(experiment=experiment, number=n // experiments + 1, attempt=1, submitted=True,
                              params={"lr": 10 ** self.rng.uniform(-4, -2), "batch_size": 8},
                              status=Trial.Status.PLANNING, total_steps=TOTAL_STEPS, step=STEPS_PER_TRIAL,
                              started=self.now))
        made = Trial.objects.bulk_create(rows, batch_size=BATCH)
        for trial in made:
            trial.queue_id = str(trial.pk)
        Trial.objects.bulk_update(made, ["queue_id"], batch_size=BATCH)
        self._telemetry(made)
        self._send(made)
        self.trials += trials
        while trial_events_sync():  # the statuses the queue holds now
            pass

    def _telemetry(self, trials: list[Any]) -> None:
        from webapp.ground.models import Trial
        from webapp.telemetry.models import EvalMetric, StepMetric, UnitSpan

        t0 = self.now.timestamp() - 3600
        steps, evals, spans = [], [], []
        for trial in trials:
            floor = self.rng.uniform(1.5, 3.0)
            for step in range(STEPS_PER_TRIAL):
                loss = floor + 4 * math.exp(-step / 6) + self.rng.gauss(0, 0.02)
                steps.append(StepMetric(trial=trial, attempt=1, step=step, loss=loss, lr=trial.params["lr"],
                                        tokens=(step + 1) * 4096, time=t0 + step))
                if (step + 1) % EVAL_EVERY == 0:
                    evals.append(EvalMetric(trial=trial, attempt=1, step=step, loss=loss + 0.1,
                                            perplexity=math.exp(loss + 0.1), time=t0 + step))
                    trial.best_val_loss = min(trial.best_val_loss or math.inf, loss + 0.1)
            trial.best_val_ppl = math.exp(trial.best_val_loss)
            for unit in range(2):
                self.spans += 1
                start = t0 + self.rng.uniform(0, 3000)
                spans.append(UnitSpan(trial=trial, host=self.queue.host_id, entry_id=f"{self.spans}-0",
                                      device=DEVICES[unit], unit=unit, step=0, micro_batch=0, phase="F", shard=0,
                                      start=start, end=start + self.rng.uniform(0.5, 2.0), bytes_moved=1 << 20,
                                      peak_bytes=64 << 20))
        Trial.objects.bulk_update(trials, ["best_val_loss", "best_val_ppl"], batch_size=BATCH)
        for model, rows in ((StepMetric, steps), (EvalMetric, evals), (UnitSpan, spans)):
            model.objects.bulk_create(rows, batch_size=BATCH)

    def _send(self, trials: list[Any]) -> None:
        """Submit `trials`; plan all but the last tenth as a device would; pause one in fifty; and, the first
        time, let each device claim a trial."""
        from worker.contract import SyntheticJob

        for trial in trials:
            self.queue.submit(trial_id=trial.queue_id, job=SyntheticJob(units=1000), export_dir="/nonexistent",
                              team=str(trial.experiment.team_id), host_bytes=0)
        planned = []
        for _ in range(len(trials) - len(trials) // 10):
            job = self.queue.claim_plan(DEVICES[0])
            if job is None:
                break
            plan = {"shards": [{"index": 0, "layers": ["embed", "block.0"], "state_bytes": 8 << 20}],
                    "peak_bytes": 48 << 20, "budget_bytes": 256 << 20, "state_bytes": 16 << 20,
                    "spilled_bytes": {"parameters": 4 << 20, "optimizer": 8 << 20}}
            self.queue.plan_done(job, remaining_units=self.rng.randint(50, 5000), unit_s=self.rng.uniform(0.2, 2.0),
                                 plan=plan)
            planned.append(job.trial_id)
        for trial_id in planned[::50]:
            self.queue.pause(trial_id)
        for device in DEVICES:
            self.queue.survey(device, "e1")
        running = [r.trial_id for r in self.queue.trials() if r.state == "running"]
        for device, trial_id in zip(DEVICES[len(running):], [t for t in planned[1::50]], strict=False):
            self.queue.claim(trial_id, device)

    def serve_devices(self) -> None:
        """The devices survey the queue, as their loops do between units: the pages take them to serve it."""
        for device in DEVICES:
            self.queue.survey(device, "e1")


def page_urls(lab: Lab) -> dict[str, str]:
    """The pages measured, as the first team's user opens them."""
    from django.urls import reverse

    team = lab.teams[0]
    experiment = next(e for e in lab.experiments if e.team_id == team.pk)
    return {
        "experiment_list": reverse("experiment_list"),
        "experiment": reverse("experiment_detail", args=[experiment.pk]),
        "leaderboard": reverse("leaderboard", args=[lab.datasets[0].pk]),
        "lab_queue": reverse("lab_queue"),
    }


def count_queries(lab: Lab) -> dict[str, int]:
    """The queries of one GET of each page, in process, after a first GET that is not counted."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(lab.users[0])
    lab.serve_devices()
    counts = {}
    for name, url in page_urls(lab).items():
        if client.get(url).status_code != 200:
            raise SystemExit(f"GET {url}: not 200")
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        if response.status_code != 200:
            raise SystemExit(f"GET {url}: HTTP {response.status_code}")
        counts[name] = len(captured.captured_queries)
    return counts


def timed(connection: http.client.HTTPConnection, cookie: str, path: str, repeat: int) -> list[float]:
    """Milliseconds of `repeat` GETs of `path`, one after another."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        connection.request("GET", path, headers={"Cookie": cookie})
        response = connection.getresponse()
        response.read()
        times.append((time.perf_counter() - start) * 1000)
        if response.status != 200:
            raise SystemExit(f"GET {path}: HTTP {response.status}")
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(args: argparse.Namespace, host_id: str) -> dict[str, Any]:
    import redis
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    from worker.scheduling.queue import ShardQueue

    call_command("migrate", verbosity=0)
    client = redis.Redis.from_url(settings.HYDRA.worker.redis_url, decode_responses=True)
    lab = Lab(queue=ShardQueue(client, host_id), rng=random.Random(0))
    started = time.perf_counter()
    small_experiments = args.experiments // 10
    lab.grow(experiments=small_experiments, trials=args.trials // 10)
    small = count_queries(lab)
    lab.grow(experiments=args.experiments - small_experiments, trials=args.trials - args.trials // 10)
    print(f"seeded {lab.trials} trials in {len(lab.experiments)} experiments of {TEAMS} teams, with "
          f"{lab.trials * STEPS_PER_TRIAL} steps, {lab.trials * STEPS_PER_TRIAL // EVAL_EVERY} evaluations and "
          f"{lab.spans} unit spans, and sent them to the queue, in {time.perf_counter() - started:.1f} s", flush=True)
    large = count_queries(lab)
    print(f"queries per page at {args.trials // 10} and {lab.trials} trials: "
          + ", ".join(f"{name} {small[name]} / {large[name]}" for name in small), flush=True)

    port = free_port()
    server = serve(port)
    pages = {}
    try:
        session = Client()
        session.force_login(lab.users[0])
        cookie = f"{settings.SESSION_COOKIE_NAME}={session.cookies[settings.SESSION_COOKIE_NAME].value}"
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for name, url in page_urls(lab).items():
            lab.serve_devices()
            timed(connection, cookie, url, 2)  # warm the server's caches and connections
            times = timed(connection, cookie, url, args.repeat)
            pages[name] = {"p50_ms": round(statistics.median(times), 1), "p99_ms": round(percentile(times, 0.99), 1),
                           "queries": large[name]}
            print(f"{name} ({url}): p50 {pages[name]['p50_ms']} ms, p99 {pages[name]['p99_ms']} ms over "
                  f"{len(times)} requests", flush=True)
        connection.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        keys = list(client.scan_iter(f"hydra:{host_id}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    constant = small == large
    return {
        "trials": lab.trials,
        "experiments": len(lab.experiments),
        "pages": pages,
        "queries_constant": constant,
        "target_met": constant and all(p["p50_ms"] < TARGET_P50_MS and p["p99_ms"] < TARGET_P99_MS
                                       for p in pages.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--experiments", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=30, help="timed GETs of each page")
    parser.add_argument("--quick", action="store_true", help="300 trials in 30 experiments, 15 GETs a page")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.experiments, args.repeat = 300, 30, 15
    if args.experiments < 10 or args.trials < args.experiments:
        parser.error("--experiments must be at least 10, and --trials at least --experiments")

    database_url, name = throwaway_database(os.environ.get("DATABASE_URL", LOCAL_SERVER))
    os.environ["DATABASE_URL"] = database_url
    host_id = f"bench-web-{uuid.uuid4().hex[:10]}"
    os.environ["HYDRA_HOST_ID"] = host_id  # the server's queue is this throw-away host's
    import django

    django.setup()
    from django.db import connections

    try:
        result = measure(args, host_id)
    finally:
        connections.close_all()
        drop_database(database_url, name)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
