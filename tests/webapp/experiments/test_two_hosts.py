"""A lab of two hosts (two host ids on this machine, each with its own device workers and spill directory):
one web app places an experiment's trials on both, ingests both hosts' telemetry, and shows every curve and
export."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.urls import reverse

from tests.webapp.experiments.factories import make_experiment
from tests.worker.conftest import device_workers  # noqa: F401 -- a fixture
from webapp.experiments import services
from webapp.ground.models import Trial

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.timeout(300)]


@pytest.fixture
def redis_url(settings) -> str:
    """A Redis database of this test's own: the lab is exactly the two hosts it starts (any other test's live
    workers register their hosts in the default database, and would take trials)."""
    url = settings.HYDRA.worker.redis_url.rsplit("/", 1)[0] + "/7"
    settings.HYDRA = dataclasses.replace(settings.HYDRA,
                                         worker=dataclasses.replace(settings.HYDRA.worker, redis_url=url))
    redis.Redis.from_url(url).flushdb()
    return url


def test_an_experiment_runs_on_both_hosts_of_a_lab_and_shows_all_its_curves_and_exports(
        client, alice, alice_team, alice_dataset, settings, device_workers, django_capture_on_commit_callbacks,  # noqa: F811
) -> None:
    first, second = device_workers("cpu0"), device_workers("cpu0")
    assert first.host_id != second.host_id and first.spill_dir != second.spill_dir
    settings.HYDRA = dataclasses.replace(settings.HYDRA,
                                         worker=dataclasses.replace(settings.HYDRA.worker, host_id=first.host_id))
    experiment = make_experiment(alice_team, alice_dataset, budget=4, eval_every=2,
                                 space={"lr": {"values": [1e-3, 2e-3, 3e-3, 4e-3]}, "batch_size": {"values": [2]}})
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    trials = list(experiment.trials.order_by("number"))
    assert {t.host for t in trials} == {first.host_id, second.host_id}  # two on each: the least loaded takes one
    assert sorted(t.host for t in trials).count(first.host_id) == 2

    deadline = time.monotonic() + 240
    while Trial.objects.filter(experiment=experiment).exclude(status__in=Trial.ENDED).exists():
        call_command("hydra_ingest", "--once")  # drains every registered host
        assert time.monotonic() < deadline, first.logs() + second.logs()
        time.sleep(0.2)
    trials = list(experiment.trials.order_by("number"))
    assert [(t.status, t.step) for t in trials] == [("finished", 4)] * 4, [t.message for t in trials]
    for trial in trials:  # each host's worker wrote its trials' exports where the web app serves them from
        assert (Path(trial.export_path) / "config.json").exists()
        assert not (first.spill_dir / trial.queue_id).exists() and not (second.spill_dir / trial.queue_id).exists()

    client.force_login(alice)
    curves = client.get(reverse("dashboard_curves_data", args=[experiment.pk])).json()
    assert sorted(curves["trials"]) == sorted(str(t.pk) for t in trials)
    page = client.get(reverse("lab_queue"), {"host": second.host_id})
    assert page.status_code == 200 and first.host_id.encode() in page.content
    assert second.host_id.encode() in page.content  # one page per host of the lab, linked from each other
    assert client.get(reverse("lab_queue"), {"host": "not-a-host-of-this-lab"}).status_code == 404
