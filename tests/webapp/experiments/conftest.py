from __future__ import annotations

import dataclasses
import uuid

import pytest

from tests.webapp.datasets.factories import make_dataset, use_data_dir
from worker.scheduling.queue import ShardQueue


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    use_data_dir(settings, tmp_path)
    return tmp_path


@pytest.fixture
def alice_dataset(alice_team):
    return make_dataset(alice_team, name="alice corpus")


@pytest.fixture
def bob_dataset(bob_team):
    return make_dataset(bob_team, name="bob corpus")


@pytest.fixture
def scheduler(settings, redis_client):
    """The real shard queue (Redis) the web app submits to and controls, under a throw-away host namespace
    that is deleted afterwards. No device worker takes from it: submitted trials wait to be planned, unless
    a test plans them as a device would (`planned`)."""
    host = f"test-web-{uuid.uuid4().hex[:10]}"
    settings.HYDRA = dataclasses.replace(settings.HYDRA,
                                         worker=dataclasses.replace(settings.HYDRA.worker, host_id=host))
    yield ShardQueue(redis_client, host)
    keys = list(redis_client.scan_iter(match=f"*{host}*", count=1000))
    if keys:
        redis_client.delete(*keys)


def planned(queue: ShardQueue, trial_id: str) -> None:
    """Plan the trial as a device worker does (claim the planning job, report its plan): it becomes runnable."""
    job = queue.claim_plan("cpu0")
    assert job is not None and job.trial_id == trial_id
    queue.plan_done(job, remaining_units=10, unit_s=0.1, plan={"shards": []})
