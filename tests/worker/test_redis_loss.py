"""What the workers do when Redis loses their queue's data (emptied, or restarted from an append-only file a
second behind): leases still fence the spill stores, device loops go on, and a trial submitted again takes up
its committed store where it left off, or fails saying its store is gone.

Redis is "emptied" here by deleting the test host's keys, which is what FLUSHALL does to one host; the
durability tests (tests/webapp/experiments/test_durability.py) flush and kill a private Redis for real.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
import torch

from tests.plain_pytorch import assert_bit_identical, exported_weights, one_thread, plain_reference
from tests.worker.test_engine_trials import tiny_trial
from worker.contract import EngineJob, SyntheticJob, job_from_dict
from worker.scheduling.engine_runner import EngineRunner
from worker.scheduling.queue import ShardQueue
from worker.scheduling.runner import UnitDone, WorkloadError

CPU = torch.device("cpu")


def _empty(client: redis.Redis, queue: ShardQueue) -> None:
    """Lose every key of the queue's host, as FLUSHALL would."""
    keys = list(client.scan_iter(match=queue.key("*"), count=1000))
    if keys:
        client.delete(*keys)


def test_a_lease_granted_after_redis_lost_its_data_outranks_every_earlier_one(
        redis_client: redis.Redis, shard_queue: ShardQueue) -> None:
    shard_queue.submit(trial_id="t", job=SyntheticJob(units=3), export_dir="/x")
    shard_queue.plan_done(shard_queue.claim_plan("cpu0"), remaining_units=3, unit_s=0.1, plan={})
    before = shard_queue.claim("t", "cpu0")
    assert before is not None
    _empty(redis_client, shard_queue)
    # A Redis that lost its data grants its next lease in a later millisecond than any before the loss (its
    # restart alone takes longer); here the loss is immediate, so the clock is let to move on.
    time.sleep(0.01)

    shard_queue.submit(trial_id="t", job=SyntheticJob(units=3), export_dir="/x")
    job = shard_queue.claim_plan("cpu0")
    assert job is not None and int(job.token) > int(before.token)  # the store's fence would refuse a smaller one
    shard_queue.plan_done(job, remaining_units=3, unit_s=0.1, plan={})
    after = shard_queue.claim("t", "cpu1")
    assert after is not None and int(after.token) > int(job.token)


def test_a_device_loop_whose_record_redis_lost_goes_on_and_a_replaced_one_still_ends(
        redis_client: redis.Redis, shard_queue: ShardQueue) -> None:
    shard_queue.device_start("cpu0", "e1")
    assert shard_queue.survey("cpu0", "e1").alive
    _empty(redis_client, shard_queue)

    assert shard_queue.survey("cpu0", "e1").alive
    assert shard_queue.devices()["cpu0"]["epoch"] == "e1"
    shard_queue.device_start("cpu0", "e2")  # the worker restarted: its old loop must end
    assert not shard_queue.survey("cpu0", "e1").alive


def test_a_plan_of_a_trial_that_resumes_keeps_its_count_of_units(shard_queue: ShardQueue) -> None:
    shard_queue.submit(trial_id="t", job=SyntheticJob(units=9), export_dir="/x")
    shard_queue.plan_done(shard_queue.claim_plan("cpu0"), remaining_units=4, unit_s=0.1, plan={}, units_done=5)
    record = shard_queue.trial("t")
    assert (record.units_done, record.remaining_units, record.state) == (5, 4, "runnable")


def test_an_engine_job_to_resume_says_so_and_a_plain_one_is_unchanged(tokens: str) -> None:
    trial = tiny_trial(tokens, seed=0, lr=1e-3)
    assert "resume" not in EngineJob(trial=trial).to_dict()
    assert job_from_dict(EngineJob(trial=trial, resume=True).to_dict()) == EngineJob(trial=trial, resume=True)


def _place(done: UnitDone) -> tuple[object, ...]:
    return (done.remaining_units, done.step, done.micro_batch, done.phase, done.shard,
            [(s.step, s.loss) for s in done.steps], [(e.step, e.loss) for e in done.evals])


def test_a_trial_planned_again_takes_up_its_store_and_trains_exactly(tokens: str, tmp_path: Path) -> None:
    """The queue lost the trial after some units; planned again (by a new runner: another process), it
    goes on from its last commit, first reporting that commit's unit again (the next lease of its lane carries
    the token that committed it, as the queue's plan_done keeps it), and ends with plain PyTorch's weights.
    Each unit runs in the first lane ready, as a queue of one device leases them."""
    trial = tiny_trial(tokens, seed=3, lr=2e-3)
    with one_thread():
        first = EngineRunner(spill_dir=tmp_path / "spill", device=CPU)
        planned = first.plan(trial_id="t", job=EngineJob(trial=trial))
        done, lane = [], planned.ready[0]
        for i in range(5):
            done.append(first.run_unit(trial_id="t", job=EngineJob(trial=trial), units_done=i, next_trial=None,
                                       token=1 + i, lane=lane))
            lane = done[-1].ready[0]

        again = EngineRunner(spill_dir=tmp_path / "spill", device=CPU)
        resumed = again.plan(trial_id="t", job=EngineJob(trial=trial, resume=True))
        assert (resumed.units_done, resumed.remaining_units) == (4, planned.remaining_units - 4)
        assert resumed.plan == planned.plan and resumed.expired == (done[-1].micro_batch, 5)
        reported = again.run_unit(trial_id="t", job=EngineJob(trial=trial), units_done=4, next_trial=None,
                                  token=6, lane=resumed.expired[0], expired=str(resumed.expired[1]))
        assert isinstance(reported, UnitDone) and isinstance(done[-1], UnitDone)
        assert _place(reported) == _place(done[-1])  # unit 4 reported again, with what it committed
        left, units_done, token = reported.remaining_units, 5, 7
        while left:
            result = again.run_unit(trial_id="t", job=EngineJob(trial=trial), units_done=units_done,
                                    next_trial=None, token=token, lane=reported.ready[0])
            assert isinstance(result, UnitDone)
            left, units_done, token, reported = result.remaining_units, units_done + 1, token + 1, result
        again.export(trial_id="t", job=EngineJob(trial=trial), export_dir=str(tmp_path / "export"))
    assert units_done == planned.remaining_units
    assert_bit_identical(exported_weights(tmp_path / "export"), plain_reference(trial, tmp_path / "plain").weights)


def test_a_trial_to_resume_whose_store_is_gone_fails_with_the_reason(tokens: str, tmp_path: Path) -> None:
    runner = EngineRunner(spill_dir=tmp_path, device=CPU)
    job = EngineJob(trial=tiny_trial(tokens, seed=0, lr=1e-3))
    with pytest.raises(WorkloadError, match=r"^the spill store of trial 7 is gone \(host restarted\?\) and it has "
                                            r"no checkpoint$"):
        runner.plan(trial_id="7", job=EngineJob(trial=job.trial, resume=True))
    runner.plan(trial_id="7", job=job)  # a new trial is planned afresh
    runner.discard(trial_id="7")
    with pytest.raises(WorkloadError, match="the spill store of trial 7 is gone"):
        runner.run_unit(trial_id="7", job=job, units_done=0, next_trial=None, token=1)


def test_a_store_left_by_another_trial_under_the_same_id_is_not_taken_up(tokens: str, tmp_path: Path) -> None:
    """The database was replaced and ids are used again, while the host kept its stores."""
    runner = EngineRunner(spill_dir=tmp_path, device=CPU)
    old = EngineJob(trial=tiny_trial(tokens, seed=0, lr=1e-3))
    planned = runner.plan(trial_id="1", job=old)
    runner.run_unit(trial_id="1", job=old, units_done=0, next_trial=None, token=1, lane=planned.ready[0])
    new = EngineJob(trial=tiny_trial(tokens, seed=1, lr=1e-3))

    fresh = runner.plan(trial_id="1", job=new)
    assert (fresh.units_done, fresh.remaining_units) == (0, planned.remaining_units)
    assert runner._open("1").spec == new.trial
    with pytest.raises(WorkloadError, match="the spill store of trial 1 is gone"):
        runner.plan(trial_id="1", job=EngineJob(trial=old.trial, resume=True))
