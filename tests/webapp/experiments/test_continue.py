"""Continuing a finished trial from its page, end to end on a real device worker: the trial goes back to the
queue under a continuation of its own, trains the added steps from its last checkpoint with their own schedule,
and finishes with its total steps on one curve, its weights those of the same two segments trained in one go;
a trial whose experiment keeps no checkpoints is refused saying why, and another team cannot continue it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.plain_pytorch import CPU, assert_bit_identical, exported_weights, one_thread
from tests.private_redis import PrivateRedis
from tests.webapp.experiments.factories import make_experiment
from tests.worker.device_workers import DeviceWorkers
from webapp.experiments import services
from webapp.ground.models import Experiment, Trial
from webapp.telemetry.models import StepMetric
from worker.engine import TrialSession, trial_create
from worker.engine.config import TrialSpec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.timeout(600)]
SPACE = {"lr": {"values": [0.003]}, "batch_size": {"values": [2]}}
ADD = {"continue-steps": "3", "continue-lr": "0.001", "continue-warmup_steps": "1", "continue-decay": "linear"}


def _ingest_until_ended(experiment: Experiment, workers, timeout_s: float = 240) -> Trial:
    deadline = time.monotonic() + timeout_s
    while True:
        call_command("hydra_ingest", "--once")
        (trial,) = experiment.trials.all()
        if trial.status in Trial.ENDED:
            return trial
        assert time.monotonic() < deadline, f"{trial.status} {trial.message}\n{workers.logs()}"
        time.sleep(0.2)


def _trained_in_one_go(spec: TrialSpec, root: Path) -> dict:
    """The final weights of `spec` (both segments) trained by the engine in this process, on one thread."""
    with one_thread():
        trial_create(spec=spec, spill_dir=root, trial_id="whole", device=CPU, cuts=[0])
        session = TrialSession.open(spill_dir=root, trial_id="whole", device=CPU)
        while session.next_unit() is not None:
            session.run_unit()
        session.export(root / "final")
    return exported_weights(root / "final")


@pytest.fixture
def workers(settings, tmp_path: Path) -> Iterator[DeviceWorkers]:
    """One CPU device worker on a private Redis (no other test's hosts to place trials on), writing its
    checkpoints and exports under the web app's data directory, which the web app submits to."""
    private = PrivateRedis(tmp_path / "redis")
    private.start()
    workers = DeviceWorkers(redis_url=private.url, root=tmp_path / "workers", lease_s=5.0,
                            env={"HYDRA_DATA_DIR": str(settings.HYDRA.data_dir)})
    settings.HYDRA = dataclasses.replace(settings.HYDRA, worker=dataclasses.replace(
        settings.HYDRA.worker, redis_url=private.url, host_id=workers.host_id))
    try:
        workers.start("cpu0")
        yield workers
    finally:
        workers.stop()
        private.kill()


def test_a_finished_trial_is_continued_from_its_page_on_one_curve(
        alice, alice_team, alice_dataset, alice_client, bob_client, settings, workers: DeviceWorkers,
        tmp_path: Path) -> None:
    kept = make_experiment(alice_team, alice_dataset, space=SPACE, budget=4, eval_every=2)
    bare = make_experiment(alice_team, alice_dataset, space=SPACE, budget=4, eval_every=2, checkpoint_minutes=0,
                           name="bare")
    services.experiment_launch(experiment=kept, actor=alice)
    services.experiment_launch(experiment=bare, actor=alice)
    trial = _ingest_until_ended(kept, workers)
    without = _ingest_until_ended(bare, workers)
    assert (trial.status, trial.step, without.status) == ("finished", 4, "finished"), trial.message
    first_queue_id = trial.queue_id

    page = alice_client.get(f"/trials/{trial.pk}/").content.decode()
    assert 'id="continue-form"' in page and "kept on disk until the trial or its experiment is deleted" in page
    assert bob_client.post(f"/trials/{trial.pk}/continue/", ADD).status_code == 404  # another team's trial
    refused = alice_client.post(f"/trials/{without.pk}/continue/", ADD)
    assert refused.status_code == 400
    assert "its experiment takes no checkpoints (checkpoint_minutes is 0)" in refused.content.decode()
    assert 'id="continue-form"' not in alice_client.get(f"/trials/{without.pk}/").content.decode()
    invalid = alice_client.post(f"/trials/{trial.pk}/continue/", {**ADD, "continue-warmup_steps": "5"})
    assert invalid.status_code == 400 and "cannot be longer than the 3 added steps" in invalid.content.decode()

    response = alice_client.post(f"/trials/{trial.pk}/continue/", ADD)
    assert response.status_code == 302
    trial.refresh_from_db()
    assert (trial.status, trial.total_steps, trial.queue_id) == ("planning", 7, f"{first_queue_id}-c1")
    assert trial.continued[0] | {"at": None} == {"after": 4, "steps": 3, "lr": 0.001, "warmup_steps": 1,
                                                 "decay": "linear", "at": None, "queue_id": f"{first_queue_id}-c1",
                                                 "from": first_queue_id}
    trial = _ingest_until_ended(kept, workers)
    assert (trial.status, trial.step, trial.total_steps) == ("finished", 7, 7), trial.message
    curve = list(StepMetric.objects.filter(trial=trial, attempt=trial.attempt).order_by("step")
                 .values_list("step", flat=True))
    assert curve == list(range(1, 8))  # one curve: the added steps after the old ones
    assert "continued +3 steps" in alice_client.get(f"/trials/{trial.pk}/").content.decode()
    assert "continued +3" in alice_client.get(f"/experiments/{kept.pk}/").content.decode()
    spec = TrialSpec.from_dict(trial.spec)
    assert spec.total_steps == 7 and len(spec.continuations) == 1
    assert_bit_identical(exported_weights(trial.export_dir_for(trial.queue_id)),
                         _trained_in_one_go(spec, tmp_path / "whole"))

    checkpoints = settings.HYDRA.data_dir / "checkpoints"
    assert (checkpoints / trial.queue_id).is_dir()
    workers.wait(lambda: not (checkpoints / first_queue_id).exists(), 30, "the superseded checkpoint deleted")
    services.trial_delete(trial=trial, actor=alice)
    assert not (checkpoints / trial.queue_id).exists()
    assert not trial.export_dir_for(first_queue_id).exists()
