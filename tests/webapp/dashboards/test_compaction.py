"""Compaction of old telemetry against real PostgreSQL and Redis: the dashboards draw the same from far fewer
rows, and nothing a running or recent trial needs is touched."""

from __future__ import annotations

import dataclasses
import datetime
import math
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command

from tests.webapp.telemetry.factories import make_experiment, write_sample, write_span, write_steps
from webapp import config
from webapp.dashboards import figures, selectors
from webapp.dashboards.compaction import Schedule, telemetry_compact
from webapp.experiments.ingest import telemetry_ingest
from webapp.ground.models import Experiment, Trial
from webapp.labqueue.selectors import WINDOWS
from webapp.telemetry.models import CompactedTrial, DeviceSample, EvalMetric, SampleLane, StepMetric, UnitSpan

pytestmark = pytest.mark.django_db

DAY = 86400.0
AGE = datetime.timedelta(days=14)


def _at(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)


def _run(trial: Trial, start: float, end: float | None, status: str = "finished") -> None:
    """The trial was created a minute before it started at `start`, and is `status` since `end`."""
    Trial.objects.filter(pk=trial.pk).update(status=status, created=_at(start - 60), started=_at(start),
                                             finished=end and _at(end))


def _curve_figures(experiments: list[Experiment]) -> list[dict]:
    """Every learning-curve figure the curves page offers for `experiments`, as the page builds them."""
    trials = selectors.experiment_trials(experiments=experiments)
    curves = selectors.curves(trials=trials)
    return [figures.learning_curves(curves, x=x, metric=metric) for x in figures.X_AXES for metric in figures.METRICS]


def _device_figures(experiment: Experiment) -> dict:
    """The devices page's figures and poll cursors for `experiment`, as the page builds them."""
    trials = selectors.experiment_trials(experiments=[experiment])
    devices = selectors.devices(experiment=experiment, trials=trials)
    return {
        "timeline": figures.device_timeline(devices, trials),
        "utilization": figures.device_utilization(devices.samples, devices.origin),
        "memory": figures.device_memory(devices.samples, devices.origin, []),
        "cursor": (devices.cursor, devices.sample_after),
    }


@pytest.fixture
def old() -> float:
    """A moment three weeks ago: older than the age of 14 days."""
    return time.time() - 21 * DAY


def test_an_old_trials_curves_draw_the_same_from_a_few_hundred_rows(alice_team, redis_client, host_id, old):
    experiment = make_experiment(alice_team, trials=[{"lr": 1e-3}, {"lr": 3e-3}], total_steps=5000)
    long, short = experiment.trials.order_by("number")
    write_steps(redis_client, host_id, long, range(5000), t0=old)
    write_steps(redis_client, host_id, short, range(300), t0=old)
    telemetry_ingest(host_id=host_id)
    for trial in (long, short):
        _run(trial, old, old + 600)
    Experiment.objects.filter(pk=experiment.pk).update(launched=_at(old - 60))
    before = _curve_figures([experiment])
    lowest = StepMetric.objects.filter(trial=long).order_by("loss", "step").values_list("step", flat=True).first()

    result = telemetry_compact(older_than=AGE)

    assert _curve_figures([experiment]) == before
    kept = StepMetric.objects.filter(trial=long)
    # Read at level 2 (buckets of 64 steps): at most the first, last, lowest and highest of each of 79 buckets.
    assert kept.count() <= 4 * math.ceil(5000 / 64)
    assert {1, lowest, 5000} <= set(kept.values_list("step", flat=True))  # the ends and the best survive
    assert StepMetric.objects.filter(trial=short).count() == 300  # a short curve is drawn whole: kept whole
    assert EvalMetric.objects.filter(trial=long).count() == 500
    assert (result.trials, result.steps) == (2, 5000 - kept.count())


def test_a_trials_rows_are_bounded_whatever_its_length(alice_team, redis_client, host_id, old):
    lengths = (1600, 3300, 8000)
    experiment = make_experiment(alice_team, trials=[{"lr": n} for n in lengths], total_steps=max(lengths))
    for trial, n in zip(experiment.trials.order_by("number"), lengths, strict=True):
        write_steps(redis_client, host_id, trial, range(n), t0=old)
        telemetry_ingest(host_id=host_id)
        _run(trial, old, old + 600)
    before = _curve_figures([experiment])

    telemetry_compact(older_than=AGE)

    assert _curve_figures([experiment]) == before
    counts = [StepMetric.objects.filter(trial=t).count() for t in experiment.trials.order_by("number")]
    # Four per bucket of the level each is read at (0, 1 and 2), never more than the curves' read budget.
    assert counts[0] == 1600
    assert counts[1] <= 4 * math.ceil(3300 / 8) and counts[2] <= 4 * math.ceil(8000 / 64), counts
    assert max(counts) <= selectors.READ_FACTOR * selectors.TRAIN_POINTS


def test_running_and_recent_trials_and_every_evaluation_are_kept(alice_team, redis_client, host_id, old):
    experiment = make_experiment(alice_team, trials=[{"lr": 1e-3}, {"lr": 2e-3}, {"lr": 3e-3}],
                                 total_steps=3000)
    ended, recent, running = experiment.trials.order_by("number")
    for trial in (ended, recent, running):
        write_steps(redis_client, host_id, trial, range(3000), t0=old)
    telemetry_ingest(host_id=host_id)
    _run(ended, old, old + 600)
    _run(recent, old, time.time() - 2 * DAY)
    _run(running, old, None, status="running")
    before = _curve_figures([experiment])

    telemetry_compact(older_than=AGE)

    assert StepMetric.objects.filter(trial=ended).count() < 3000
    assert StepMetric.objects.filter(trial=recent).count() == 3000
    assert StepMetric.objects.filter(trial=running).count() == 3000
    assert EvalMetric.objects.count() == 900
    assert _curve_figures([experiment]) == before
    assert list(CompactedTrial.objects.values_list("trial_id", flat=True)) == [ended.pk]


def test_the_steps_of_an_attempt_a_retry_replaced_go(alice_team, redis_client, host_id, old):
    experiment = make_experiment(alice_team, total_steps=200)
    trial = experiment.trials.get()
    write_steps(redis_client, host_id, trial, range(150), t0=old)
    telemetry_ingest(host_id=host_id)
    Trial.objects.filter(pk=trial.pk).update(attempt=2, queue_id=f"{trial.pk}.2", step=0)
    trial.refresh_from_db()
    write_steps(redis_client, host_id, trial, range(200), t0=old + 100)
    telemetry_ingest(host_id=host_id)
    _run(trial, old, old + 600)
    before = _curve_figures([experiment])

    telemetry_compact(older_than=AGE)

    assert set(StepMetric.objects.filter(trial=trial).values_list("attempt", flat=True)) == {2}
    assert StepMetric.objects.filter(trial=trial).count() == 200
    assert _curve_figures([experiment]) == before


@pytest.fixture
def lab(alice_team, bob_team, redis_client, host_id, old, monkeypatch):
    """Three weeks ago: Alice's experiment ran on cpu0 and cpu1 and ended, Bob's ran on cpu0 (overlapping hers)
    and ended, and Alice's second one started on cpu1 and still runs; cpu2 ran nobody's units. Every device
    was sampled each second throughout, and is sampled now."""
    monkeypatch.setattr(selectors, "SPAN_LIMIT", 50)
    monkeypatch.setattr(selectors, "SAMPLE_BUCKETS", 30)
    alice = make_experiment(alice_team, name="alice", trials=[{"lr": 1e-3}, {"lr": 2e-3}])
    bob = make_experiment(bob_team, name="bob")
    running = make_experiment(alice_team, name="still running")
    a1, a2 = alice.trials.order_by("number")
    plan = [(a1, "cpu0", 0, 1000), (a2, "cpu1", 500, 2000), (bob.trials.get(), "cpu0", 1500, 3000),
            (running.trials.get(), "cpu1", 2500, 3500)]
    for trial, device, start, end in plan:
        for unit in range(60):
            at = old + start + unit * (end - start) / 60
            write_span(redis_client, host_id, trial, device=device, unit=unit, start=at, end=at + 5)
    for second in range(-500, 3500):
        for index, device in enumerate(("cpu0", "cpu1", "cpu2")):
            write_sample(redis_client, host_id, device=device, at=old + second,
                         utilization=(second * 7919 + index * 13) % 101 / 100,
                         memory_used=((second * 104729 + index) % 977) << 20)
    for second in range(100):
        write_sample(redis_client, host_id, device="cpu0", at=time.time() - 100 + second, utilization=0.5)
    telemetry_ingest(host_id=host_id)
    for trial, _, start, end in plan[:3]:
        _run(trial, old + start, old + end)
    _run(running.trials.get(), old + 2500, None, status="running")
    experiments = {"alice": alice, "bob": bob, "running": running}
    Experiment.objects.filter(pk__in=[e.pk for e in experiments.values()]).update(launched=_at(old - 60))
    return {name: Experiment.objects.get(pk=e.pk) for name, e in experiments.items()}


def test_old_device_telemetry_draws_the_same_from_what_the_pages_draw(lab, old, host_id):
    before = {name: _device_figures(experiment) for name, experiment in lab.items()}
    for figure in before.values():  # every page draws units and samples
        assert sum(len(trace["x"]) for trace in figure["timeline"]["data"]) == min(50, 60 * 2)
        assert figure["utilization"]["data"] and all(len(t["x"]) > 60 for t in figure["utilization"]["data"])
    samples_before = DeviceSample.objects.count()
    recent = DeviceSample.objects.filter(time__gte=time.time() - 200).count()

    result = telemetry_compact(older_than=AGE)

    assert {name: _device_figures(experiment) for name, experiment in lab.items()} == before
    alice, running = lab["alice"], lab["running"]
    # The timeline draws each experiment's newest 50 units; an ended trial keeps those, its first, one per device.
    assert UnitSpan.objects.filter(trial__experiment=alice).count() <= 50 + 2 * 2
    assert UnitSpan.objects.filter(trial__experiment=running).count() == 60
    # Samples: none of cpu2 (no units ran there) nor from outside every run window; all of the running
    # experiment's since its window began, and all of the last 14 days.
    old_samples = DeviceSample.objects.filter(time__lt=old + 2500)
    assert not old_samples.filter(device="cpu2").exists()
    assert not old_samples.filter(time__lt=old).exists()
    assert DeviceSample.objects.filter(device="cpu1", time__gte=old + 2500, time__lt=old + 3500).count() == 1000
    assert DeviceSample.objects.filter(time__gte=time.time() - 200).count() == recent
    # Per experiment and device: the first, the last, and the extremes of each of 30 (+1 per window) buckets.
    assert old_samples.filter(device="cpu0").count() <= 2 * (4 * 31 + 2)
    assert result.samples == samples_before - DeviceSample.objects.count()
    assert result.trials == 3 and result.done
    # cpu1 is compacted up to where the running experiment's window begins, and waits there.
    assert SampleLane.objects.get(host=host_id, device="cpu1").compacted_before == pytest.approx(old + 2500, abs=1e-3)


def test_compacting_again_or_dry_removes_nothing_more(lab):
    dry = telemetry_compact(older_than=AGE, dry_run=True)
    counts = (StepMetric.objects.count(), UnitSpan.objects.count(), DeviceSample.objects.count())
    assert counts == (0, 240, 3 * 4000 + 100) and not CompactedTrial.objects.exists()
    before = {name: _device_figures(experiment) for name, experiment in lab.items()}

    first = telemetry_compact(older_than=AGE)
    again = telemetry_compact(older_than=AGE)

    assert (dry.trials, dry.spans, dry.samples) == (first.trials, first.spans, first.samples)
    assert (again.trials, again.steps, again.spans, again.samples) == (0, 0, 0, 0)
    assert {name: _device_figures(experiment) for name, experiment in lab.items()} == before


def test_a_pass_out_of_time_stops_and_the_next_goes_on(lab):
    assert not telemetry_compact(older_than=AGE, budget_s=0).done
    assert not CompactedTrial.objects.exists()
    assert telemetry_compact(older_than=AGE).trials == 3


def test_the_ingest_loop_compacts_at_most_every_so_often(alice_team, redis_client, host_id, old, settings, capsys):
    experiment = make_experiment(alice_team, total_steps=5000)
    trial = experiment.trials.get()
    write_steps(redis_client, host_id, trial, range(5000), t0=old)
    telemetry_ingest(host_id=host_id)
    _run(trial, old, old + 600)
    now = [1000.0]
    schedule = Schedule(every_s=600, clock=lambda: now[0])

    settings.HYDRA = dataclasses.replace(settings.HYDRA, telemetry_keep_days=None)
    assert schedule.run_if_due() is None  # off
    settings.HYDRA = dataclasses.replace(settings.HYDRA, telemetry_keep_days=14)
    assert schedule.run_if_due().trials == 1
    assert schedule.run_if_due() is None  # not due again for ten minutes
    now[0] += 600
    assert schedule.run_if_due().trials == 0
    assert StepMetric.objects.filter(trial=trial).count() <= 316

    # The ingest command's pass compacts too.
    CompactedTrial.objects.all().delete()
    call_command("hydra_ingest", "--once", "--host", host_id)
    assert "1 trials compacted" in capsys.readouterr().out


def test_the_command_says_what_it_removed_or_would(alice_team, redis_client, host_id, old, capsys):
    experiment = make_experiment(alice_team, total_steps=5000)
    trial = experiment.trials.get()
    write_steps(redis_client, host_id, trial, range(5000), t0=old)
    telemetry_ingest(host_id=host_id)
    _run(trial, old, old + 600)

    call_command("telemetry_compact", "--dry-run")
    out = capsys.readouterr().out
    assert StepMetric.objects.filter(trial=trial).count() == 5000
    removed = 5000 - len(StepMetric.objects.filter(trial=trial, level__gte=selectors.curve_level(5000)))
    assert f"1 trials, would remove {removed} step metrics, 0 unit spans and 0 device samples" in out

    call_command("telemetry_compact", "--older-than-days", "30")  # three weeks are not old enough
    assert "0 trials, removed 0 step metrics" in capsys.readouterr().out
    call_command("telemetry_compact")
    assert f"1 trials, removed {removed} step metrics" in capsys.readouterr().out
    with pytest.raises(CommandError, match="at least 7"):
        call_command("telemetry_compact", "--older-than-days", "3")


DEV = {"DEBUG": "1"}


@pytest.mark.parametrize(("raw", "days"), [(None, 14), ("30", 30), ("7", 7), ("0", None), ("off", None),
                                           (" OFF ", None)])
def test_the_age_is_read_from_the_environment(raw, days):
    environ = DEV if raw is None else {**DEV, "HYDRA_TELEMETRY_KEEP_DAYS": raw}
    assert config.load(environ).telemetry_keep_days == days


@pytest.mark.parametrize("raw", ["two weeks", "1.5", "-1", "3"])
def test_a_bad_age_stops_the_start_naming_the_variable(raw):
    with pytest.raises(ImproperlyConfigured, match="HYDRA_TELEMETRY_KEEP_DAYS"):
        config.load({**DEV, "HYDRA_TELEMETRY_KEEP_DAYS": raw})


def test_the_shortest_age_keeps_what_the_lab_queue_shares_out():
    assert max(length for _, length in WINDOWS) <= config.TELEMETRY_KEEP_DAYS_MINIMUM * DAY

