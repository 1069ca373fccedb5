"""How fast the dashboards' data endpoints answer for a big experiment, and how much they send.

Builds a synthetic experiment in the real database (the one settings point at: SQLite by default,
PostgreSQL with DATABASE_URL): `--trials` trials of `--steps` optimizer steps each, with an evaluation every
100 steps, unit spans and device samples, stored with their levels of detail as ingest stores them. Then
times, through Django's full request stack, the first full load of the learning curves
(``curves.json`` without a cursor: every trial's whole history, downsampled). The experiment, its team and
its dataset are deleted afterwards.

The last line is one JSON object: ``{"trials", "points", "p50_ms", "p99_ms", "payload_bytes"}`` where
points is the number of stored step rows. Target at 50 x 50,000: p50 under 300 ms, payload under 2 MB.
Context (the live poll, the devices endpoint) is printed on the lines before.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("DEBUG", "1")

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from webapp.accounts.models import Membership, Team  # noqa: E402
from webapp.datasets.models import Dataset  # noqa: E402
from webapp.experiments.models import Experiment, Trial  # noqa: E402
from webapp.telemetry import levels  # noqa: E402
from webapp.telemetry.models import DeviceSample, EvalMetric, StepMetric, UnitSpan  # noqa: E402

EVAL_EVERY = 100
BATCH = 10_000


def build(*, trials: int, steps: int, seed: int) -> tuple[Experiment, object]:
    """The synthetic team, user, dataset and experiment, with every trial's telemetry stored."""
    rng = random.Random(seed)
    tag = uuid.uuid4().hex[:8]
    team = Team.objects.create(name=f"benchmark-{tag}")
    user = get_user_model().objects.create_user(username=f"benchmark-{tag}", password=uuid.uuid4().hex)
    Membership.objects.create(team=team, user=user, role=Membership.Role.OWNER, is_current=True)
    dataset = Dataset.objects.create(team=team, name="synthetic", source=Dataset.Source.UPLOAD, vocab_size=256,
                                     val_fraction=0.1, n_bytes=0, n_tokens=0, fingerprint=tag, storage_key=tag)
    launched = timezone.now()
    experiment = Experiment.objects.create(
        team=team, name="dashboard load", dataset=dataset, model={"kind": "preset", "preset": "tiny"},
        search_space={"lr": {"kind": "logfloat", "low": 1e-4, "high": 1e-2}}, strategy=Experiment.Strategy.RANDOM,
        n_trials=trials, budget=steps, eval_every=EVAL_EVERY, launched=launched,
    )
    t0 = launched.timestamp()
    for number in range(1, trials + 1):
        lr = 10 ** rng.uniform(-4, -2)
        trial = Trial.objects.create(experiment=experiment, number=number, params={"lr": lr, "batch_size": 8},
                                     status=Trial.Status.RUNNING, attempt=1, total_steps=steps, step=steps)
        Trial.objects.filter(pk=trial.pk).update(queue_id=str(trial.pk))
        _store_trial(trial, steps=steps, t0=t0, rng=rng)
    _store_devices(experiment, t0=t0, rng=rng)
    return experiment, user


def _store_trial(trial: Trial, *, steps: int, t0: float, rng: random.Random) -> None:
    floor = rng.uniform(1.5, 3.0)
    losses = [floor + 6 * math.exp(-s / (steps / 8)) + rng.gauss(0, 0.05) for s in range(steps)]
    # The levels ingest would give these rows, computed in one pass (ingest keeps them incrementally).
    level = [0] * steps
    candidates = [levels.Point(s, s, loss) for s, loss in enumerate(losses)]
    for k in range(1, levels.MAX_LEVEL + 1):
        keep = levels.representatives(candidates, k)
        for s in keep:
            level[s] = k
        candidates = [p for p in candidates if p.id in keep]
    table = StepMetric._meta.db_table
    # Plain executemany: the ORM's per-object overhead would make building 2.5 million rows take minutes.
    sql = (f"INSERT INTO {table} (trial_id, attempt, step, loss, lr, tokens, time, level) "
           "VALUES (%s, 1, %s, %s, 0.001, %s, %s, %s)")
    with transaction.atomic(), connection.cursor() as cursor:
        for start in range(0, steps, BATCH):
            cursor.executemany(sql, [(trial.pk, s, losses[s], (s + 1) * 4096, t0 + s * 0.05, level[s])
                                     for s in range(start, min(start + BATCH, steps))])
        EvalMetric.objects.bulk_create([
            EvalMetric(trial=trial, attempt=1, step=s, loss=losses[s] + 0.1, perplexity=math.exp(losses[s] + 0.1),
                       time=t0 + s * 0.05)
            for s in range(EVAL_EVERY - 1, steps, EVAL_EVERY)
        ])


def _store_devices(experiment: Experiment, *, t0: float, rng: random.Random) -> None:
    trials = list(experiment.trials.values_list("pk", flat=True))
    UnitSpan.objects.bulk_create([
        UnitSpan(trial_id=trials[u % len(trials)], host="benchmark", entry_id=f"{experiment.pk}-{u}",
                 device=f"cuda{u % 4}", unit=u, step=u, micro_batch=0, phase="F", shard=0, start=t0 + u * 0.05,
                 end=t0 + u * 0.05 + 0.045, bytes_moved=1 << 24, peak_bytes=1 << 30)
        for u in range(10_000)
    ])
    DeviceSample.objects.bulk_create([
        DeviceSample(host="benchmark", entry_id=f"{experiment.pk}-s{i}", device=f"cuda{i % 4}", time=t0 + i / 4,
                     utilization=rng.uniform(0.8, 1.0), memory_used=70 << 30, memory_total=80 << 30)
        for i in range(4 * 3600)
    ])


def timed(client: Client, url: str, params: dict[str, object], repeat: int) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(url, params)
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, response.status_code
        size = len(response.content)
    return times, size


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="10 trials x 5,000 steps, 10 requests")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.steps, args.repeat = 10, 5_000, 10

    from django.conf import settings

    settings.HYDRA.data_dir.mkdir(parents=True, exist_ok=True)  # a fresh checkout has no var/ yet (SQLite)
    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    experiment, user = build(trials=args.trials, steps=args.steps, seed=0)
    print(f"built {args.trials} x {args.steps} steps in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        client = Client(HTTP_HOST="localhost")
        client.force_login(user)
        curves_url = reverse("dashboard_curves_data", args=[experiment.pk])
        timed(client, curves_url, {}, 1)  # warm caches and connections
        full, payload = timed(client, curves_url, {}, args.repeat)
        first = client.get(curves_url).json()
        poll, poll_size = timed(client, curves_url, first["cursor"], args.repeat)
        devices, devices_size = timed(client, reverse("dashboard_devices_data", args=[experiment.pk]), {}, 5)
        print(f"live poll with nothing new: p50 {statistics.median(poll):.1f} ms, {poll_size} bytes")
        print(f"devices.json (10,000 spans, 4 devices x 1 h of samples): p50 {statistics.median(devices):.1f} ms, "
              f"{devices_size} bytes")
        result = {
            "trials": args.trials,
            "points": args.trials * args.steps,
            "p50_ms": round(statistics.median(full), 1),
            "p99_ms": round(percentile(full, 0.99), 1),
            "payload_bytes": payload,
        }
    finally:
        team = experiment.team
        experiment.delete()
        Dataset.objects.filter(team=team).delete()
        team.delete()
        user.delete()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
