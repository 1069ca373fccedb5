"""Trials survive Redis going away: killed and restarted from its append-only file, emptied, or down while a
trial is deleted. Real device workers, a private Redis this test may kill (never the shared one), PostgreSQL,
and the telemetry ingest's passes (``manage.py hydra_ingest --once``), whose reconciler repairs the queue.

Each trial is launched from the web app and stopped at a known point mid-training (a worker blocked right
after committing a unit, `worker.engine.faults`) while Redis is lost; every trial that goes on must end
with the weights of the same trial trained alone with plain PyTorch, bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from tests.plain_pytorch import assert_bit_identical, exported_weights, plain_reference
from tests.private_redis import PrivateRedis
from tests.webapp.experiments.factories import make_experiment
from tests.worker.device_workers import DeviceWorkers
from webapp.experiments import services
from webapp.ground.models import Experiment, Trial
from worker.engine.config import TrialSpec
from worker.engine.faults import REACHED, RELEASE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.timeout(600)]
SPACE = {"lr": {"values": [0.001, 0.003]}, "batch_size": {"values": [2]}}
FAULT = "after-commit@3"  # a worker blocks once a trial has committed its fourth unit, before reporting it


@dataclasses.dataclass
class Stack:
    redis: PrivateRedis
    workers: DeviceWorkers
    fault_dir: Path

    def ingest_until(self, condition: Callable[[], bool], what: str, timeout_s: float = 300) -> None:
        """Run the ingest's passes (the reconciler's among them) until `condition` holds."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{self.workers.logs()}")
            call_command("hydra_ingest", "--once")
            time.sleep(0.2)

    def blocked(self) -> dict[str, object]:
        """Wait (running the ingest) until a worker is blocked mid-training; the fault's report."""
        reached = self.fault_dir / REACHED
        self.ingest_until(reached.exists, "a worker to block after a commit")
        return json.loads(reached.read_text())

    def release(self) -> None:
        (self.fault_dir / RELEASE).touch()


@pytest.fixture
def stack(settings, tmp_path: Path) -> Iterator[Stack]:
    """A private Redis with an append-only file, one CPU device worker on it armed with `FAULT`, and the web
    app submitting to that worker's host through that Redis."""
    private = PrivateRedis(tmp_path / "redis")
    private.start()
    fault_dir = tmp_path / "fault"
    workers = DeviceWorkers(redis_url=private.url, root=tmp_path / "workers", lease_s=2.0,
                            env={"HYDRA_FAULT": FAULT, "HYDRA_FAULT_DIR": str(fault_dir)})
    settings.HYDRA = dataclasses.replace(settings.HYDRA, worker=dataclasses.replace(
        settings.HYDRA.worker, redis_url=private.url, host_id=workers.host_id))
    try:
        workers.start("cpu0")
        yield Stack(redis=private, workers=workers, fault_dir=fault_dir)
    finally:
        (fault_dir / RELEASE).parent.mkdir(parents=True, exist_ok=True)
        (fault_dir / RELEASE).touch()
        if private.process is None:
            private.start()  # the workers' warm shutdown talks to Redis
        workers.stop()
        private.kill()


def _launched(alice, team, dataset) -> Experiment:
    experiment = make_experiment(team, dataset, space=SPACE, budget=4, eval_every=2)
    services.experiment_launch(experiment=experiment, actor=alice)  # a transaction test: its sends run at once
    return experiment


def _all_ended(experiment: Experiment) -> Callable[[], bool]:
    return lambda: all(t.status in Trial.ENDED for t in experiment.trials.all())


def _assert_trained_alone(experiment: Experiment, root: Path) -> None:
    for trial in experiment.trials.order_by("number"):
        assert (trial.status, trial.step) == ("finished", trial.total_steps), trial.message
        reference = plain_reference(TrialSpec.from_dict(trial.spec), root / f"plain-{trial.queue_id}")
        assert_bit_identical(exported_weights(trial.export_dir_for(trial.queue_id)), reference.weights)


def test_redis_killed_mid_training_and_restarted_from_its_append_only_file_loses_no_trial(
        alice, alice_team, alice_dataset, stack: Stack, tmp_path: Path) -> None:
    experiment = _launched(alice, alice_team, alice_dataset)
    stack.blocked()
    stack.redis.kill()
    stack.release()  # the unit is committed; its completion cannot be sent
    call_command("hydra_ingest", "--once")  # Redis down: the pass says so and changes nothing
    stack.workers.wait(lambda: "Redis unavailable" in stack.workers.logs(), 60, "the device loop to retry")
    stack.redis.start()

    stack.ingest_until(_all_ended(experiment), "every trial to end")
    _assert_trained_alone(experiment, tmp_path)


def test_redis_emptied_mid_training_the_reconciler_rebuilds_the_queue_and_every_trial_resumes_exactly(
        alice, alice_team, alice_dataset, stack: Stack, tmp_path: Path) -> None:
    experiment = _launched(alice, alice_team, alice_dataset)
    report = stack.blocked()
    call_command("hydra_ingest", "--once")  # the ingest's next pass: the page shows the trial running
    assert experiment.trials.get(queue_id=report["trial"]).status == "running"
    stack.redis.client().flushall()
    assert stack.workers.queue.trials() == []
    stack.release()

    call_command("hydra_ingest", "--once")
    blocked = experiment.trials.get(queue_id=report["trial"])
    assert blocked.status == "planning" and blocked.message.startswith("The scheduler lost this trial")
    assert stack.workers.queue.trial(blocked.queue_id).job["resume"] is True
    stack.ingest_until(_all_ended(experiment), "every trial to end")
    _assert_trained_alone(experiment, tmp_path)
    # It went on from its store, not from scratch: the units after the flush start at the blocked one (its
    # span, and its report again with what it committed, since the emptied Redis lost it), then go on.
    units = {s["unit"] for s in stack.workers.entries("spans") if s["trial"] == blocked.queue_id and s["shard"] != -1}
    assert sorted(units) == list(range(int(report["unit"]), max(units) + 1))


def test_a_trial_deleted_while_redis_is_down_does_not_run_again_and_its_store_is_freed(
        alice, alice_team, alice_dataset, alice_client, stack: Stack, tmp_path: Path) -> None:
    experiment = _launched(alice, alice_team, alice_dataset)
    report = stack.blocked()
    deleted = experiment.trials.get(queue_id=report["trial"])
    store = stack.workers.spill_dir / deleted.queue_id
    assert store.is_dir()
    stack.redis.kill()

    response = alice_client.post(f"/trials/{deleted.pk}/delete/", follow=True)
    assert f"Trial #{deleted.number} deleted" in response.content.decode()
    stack.redis.start()
    units_done = stack.workers.queue.trial(deleted.queue_id).units_done
    call_command("hydra_ingest", "--once")  # the first pass once Redis is back cancels it
    assert stack.workers.queue.trial(deleted.queue_id).control == "cancel"
    stack.release()  # the unit it was blocked in ends, and with it the trial

    stack.ingest_until(lambda: not store.exists() and _all_ended(experiment)(), "its store to be freed")
    record = stack.workers.queue.trial(deleted.queue_id)
    assert (record.state, record.units_done) == ("cancelled", units_done + 1)  # the unit it was in, no other
    assert not deleted.export_dir_for(deleted.queue_id).exists()
    assert [t.status for t in experiment.trials.all()] == ["finished"]  # the other trial went on


def test_a_trial_the_queue_lost_whose_store_is_gone_too_fails_with_the_reason_and_offers_retry(
        alice, alice_team, alice_dataset, alice_client, stack: Stack) -> None:
    experiment = make_experiment(alice_team, alice_dataset, space={"lr": {"values": [0.001]}, "batch_size":
                                 {"values": [2]}}, budget=4, eval_every=2)
    services.experiment_launch(experiment=experiment, actor=alice)
    trial = experiment.trials.get()
    stack.blocked()
    call_command("hydra_ingest", "--once")  # the page shows it running: it trained, so it is sent to resume
    trial.refresh_from_db()
    assert trial.status == "running"
    stack.redis.client().flushall()  # the host restarted: Redis empty, /dev/shm wiped, no checkpoint taken yet
    shutil.rmtree(stack.workers.spill_dir / trial.queue_id)
    stack.release()

    stack.ingest_until(_all_ended(experiment), "the trial to end")
    trial.refresh_from_db()
    assert trial.status == "failed"
    assert trial.message.endswith(f"the spill store of trial {trial.queue_id} is gone (host restarted?) and it has "
                                  "no checkpoint")
    page = alice_client.get(f"/trials/{trial.pk}/").content.decode()
    assert f'action="{reverse("trial_action", args=[trial.pk, "retry"])}"' in page


def test_a_trial_the_queue_lost_before_it_was_seen_running_is_planned_afresh_and_finishes(
        alice, alice_team, alice_dataset, stack: Stack, tmp_path: Path) -> None:
    experiment = make_experiment(alice_team, alice_dataset, space={"lr": {"values": [0.001]}, "batch_size":
                                 {"values": [2]}}, budget=4, eval_every=2)
    services.experiment_launch(experiment=experiment, actor=alice)
    trial = experiment.trials.get()
    # No ingest pass runs until the worker blocks: Redis and the store are lost before any event of the trial
    # reached the database. It shows no step, so nothing the user saw is lost by training it from the start.
    stack.workers.wait((stack.fault_dir / REACHED).exists, 120, "a worker to block after a commit")
    stack.redis.client().flushall()
    shutil.rmtree(stack.workers.spill_dir / trial.queue_id)
    stack.release()

    stack.ingest_until(_all_ended(experiment), "the trial to end")
    trial.refresh_from_db()
    assert trial.status == "finished"
    assert stack.workers.queue.trial(trial.queue_id).job.get("resume") is not True
    _assert_trained_alone(experiment, tmp_path)
