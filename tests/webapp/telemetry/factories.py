"""Experiments with trials, and telemetry written the way the scheduler writes it, for the dashboard tests."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import redis
from django.utils import timezone

from tests.webapp.datasets.factories import make_dataset
from webapp.accounts.models import Team
from webapp.ground.models import Experiment, Trial
from worker.scheduling import telemetry


def make_experiment(team: Team, *, name: str = "sweep", trials: Sequence[dict[str, Any]] = ({"lr": 1e-3},),
                    total_steps: int = 100, status: str = "running", dataset=None,
                    objective: str = "sft") -> Experiment:
    """An experiment launched now, with one trial per params dict, each on its first attempt."""
    dataset = dataset or make_dataset(team, name=f"{name}-data")
    experiment = Experiment.objects.create(
        team=team, name=name, dataset=dataset, model={"kind": "preset", "preset": "tiny"},
        search_space={"lr": {"kind": "categorical", "values": [p.get("lr") for p in trials]}},
        strategy=Experiment.Strategy.GRID, n_trials=len(trials), budget=total_steps, eval_every=10,
        launched=timezone.now(), objective=objective,
    )
    for number, params in enumerate(trials, start=1):
        trial = Trial.objects.create(experiment=experiment, number=number, params=dict(params), status=status,
                                     attempt=1, total_steps=total_steps)
        Trial.objects.filter(pk=trial.pk).update(queue_id=str(trial.pk))
    return experiment


def write_steps(client: redis.Redis, host_id: str, trial: Trial, steps: range, *, t0: float | None = None,
                tokens_per_step: int = 256) -> None:
    """Step and eval entries in the scheduler's format, 0.1 s apart from `t0` (default: now); the loss
    decays so curves have a shape."""
    t0 = time.time() if t0 is None else t0
    pipe = client.pipeline()
    for step in steps:
        loss = 5.0 * math.exp(-step / 50) + 1.0 + 0.01 * (step % 7)
        telemetry.add(pipe, host_id, "steps", telemetry.StepMetrics(
            trial=trial.queue_id, step=step, loss=loss, lr=1e-3, tokens=(step + 1) * tokens_per_step,
            time=t0 + step * 0.1))
        if step % 10 == 9:
            telemetry.add(pipe, host_id, "evals", telemetry.EvalMetrics(
                trial=trial.queue_id, step=step, loss=loss + 0.1, perplexity=math.exp(loss + 0.1),
                time=t0 + step * 0.1))
    pipe.execute()


def write_final_eval(client: redis.Redis, host_id: str, trial: Trial, *, step: int, loss: float, bpb: float,
                     tokens: int = 4096, at: float | None = None) -> None:
    """The final evaluation on the held-out text, as a worker reports it when the trial ends (`step`: the
    last step trained)."""
    pipe = client.pipeline()
    telemetry.add(pipe, host_id, "evals", telemetry.EvalMetrics(
        trial=trial.queue_id, step=step, loss=loss, perplexity=math.exp(loss), time=time.time() if at is None else at,
        bpb=bpb, tokens=tokens, bytes=int(tokens * loss / math.log(2) / bpb), final=1))
    pipe.execute()


def write_span(client: redis.Redis, host_id: str, trial: Trial, *, device: str, unit: int, start: float,
               end: float, phase: str = "F", shard: int = 0) -> None:
    pipe = client.pipeline()
    telemetry.add(pipe, host_id, "spans", telemetry.Span(
        trial=trial.queue_id, device=device, unit=unit, step=unit // 3, micro_batch=0, phase=phase, shard=shard,
        start=start, end=end, bytes_moved=1 << 20, peak_bytes=64 << 20, pid=1))
    pipe.execute()


def write_sample(client: redis.Redis, host_id: str, *, device: str, at: float, utilization: float,
                 memory_used: int = 1 << 30, memory_total: int = 8 << 30) -> None:
    client.xadd(telemetry.stream_key(host_id, "samples"),
                {"device": device, "time": at, "utilization": utilization, "memory_used": memory_used,
                 "memory_total": memory_total})


def write_event(client: redis.Redis, host_id: str, trial: Trial, state: str, message: str = "") -> None:
    client.xadd(telemetry.stream_key(host_id, "events"), {"trial": trial.queue_id, "state": state, "message": message})
