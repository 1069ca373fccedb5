"""The contract's transition tables say what the queue's Lua scripts do: every entry is driven through the
real queue in Redis, and every control a table leaves out is refused by it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from worker.contract import (
    CONTROL_TRANSITIONS,
    IN_FLIGHT,
    UNIT_TRANSITIONS,
    Control,
    EngineJob,
    InvalidTransition,
    JobError,
    SyntheticJob,
    TrialState,
    UnitEnd,
    after_unit,
    control_changes,
    job_from_dict,
)
from worker.engine.config import DataSpec, DpoSpec, TrialSpec
from worker.scheduling.device_loop import DeviceLoop, DeviceLoopConfig
from worker.scheduling.queue import Lease, PlanJob, ShardQueue
from worker.scheduling.synthetic import SyntheticRunner

DEVICE, EPOCH = "cpu0", "epoch-1"
S = TrialState


class Driver:
    """Brings one trial of a real queue into a given situation and ends the work in flight on it."""

    def __init__(self, queue: ShardQueue, trial_id: str) -> None:
        self.queue, self.trial_id = queue, trial_id
        self.plan_job: PlanJob | None = None
        self.lease: Lease | None = None
        queue.device_start(DEVICE, EPOCH)

    @property
    def state(self) -> str:
        return self.queue.trial(self.trial_id).state

    def submit(self) -> None:
        self.queue.submit(trial_id=self.trial_id, job=SyntheticJob(units=3), export_dir="")

    def claim_plan(self) -> None:
        self.submit()
        self.plan_job = self.queue.claim_plan(DEVICE)
        assert self.plan_job is not None and self.plan_job.trial_id == self.trial_id

    def runnable(self) -> None:
        self.claim_plan()
        self.end(UnitEnd.PLANNED)

    def running(self) -> None:
        self.runnable()
        self.lease = self.queue.claim(self.trial_id, DEVICE)
        assert self.lease is not None

    def end(self, how: UnitEnd) -> None:
        """End the work in flight (a planning or a unit) the way `how` says."""
        if self.plan_job is not None:
            job, self.plan_job = self.plan_job, None
            if how == UnitEnd.PLANNED:
                self.queue.plan_done(job, remaining_units=3, unit_s=0.01, plan={})
            elif how == UnitEnd.FAILED:
                self.queue.fail(job.trial_id, job.token, "planning failed")
            else:
                self._expire()
            return
        lease, self.lease = self.lease, None
        assert lease is not None, "nothing is in flight"
        if how == UnitEnd.DONE:
            self.queue.complete(lease, remaining_units=2, unit_s=0.01)
        elif how == UnitEnd.LAST:
            self.queue.complete(lease, remaining_units=0, unit_s=0.01)
        elif how == UnitEnd.PRUNED:
            self.queue.complete(lease, remaining_units=0, unit_s=0.01, pruned=True)
        elif how == UnitEnd.REPLANNED:
            self.queue.replan(lease, remaining_units=4, unit_s=0.01, plan={}, message="smaller shards")
        elif how == UnitEnd.FAILED:
            self.queue.fail(lease.trial_id, lease.token, "unit failed")
        else:
            self._expire()

    def _expire(self) -> None:
        """Let the lease run out: the next survey gives the work back to the queue."""
        self.queue.client.zadd(self.queue.key("leases"), {self.trial_id: 0})
        self.queue.survey(DEVICE, EPOCH)

    def finish_in_flight(self) -> None:
        """End whatever work is (or will be) in flight as planned, as a device would."""
        if self.lease is not None or self.plan_job is not None:
            self.end(UnitEnd.DONE if self.lease is not None else UnitEnd.PLANNED)
        elif self.state == S.PLANNING:  # waiting to be planned: a device plans it
            self.plan_job = self.queue.claim_plan(DEVICE)
            assert self.plan_job is not None
            self.end(UnitEnd.PLANNED)


def _situations() -> dict[str, tuple[TrialState, Callable[[Driver], None]]]:
    """Every situation a trial can be in when a control arrives: its state and how to get there."""

    def paused(d: Driver) -> None:
        d.runnable()
        d.queue.pause(d.trial_id)

    def finished(d: Driver) -> None:
        d.running()
        d.end(UnitEnd.LAST)

    def pruned(d: Driver) -> None:
        d.running()
        d.end(UnitEnd.PRUNED)

    def failed(d: Driver) -> None:
        d.running()
        d.end(UnitEnd.FAILED)

    def cancelled(d: Driver) -> None:
        d.runnable()
        d.queue.cancel(d.trial_id)

    return {
        "waiting to be planned": (S.PLANNING, Driver.submit),
        "being planned": (S.PLANNING, Driver.claim_plan),
        "runnable": (S.RUNNABLE, Driver.runnable),
        "running a unit": (S.RUNNING, Driver.running),
        "paused": (S.PAUSED, paused),
        "finished": (S.FINISHED, finished),
        "pruned": (S.PRUNED, pruned),
        "failed": (S.FAILED, failed),
        "cancelled": (S.CANCELLED, cancelled),
    }


SITUATIONS = _situations()


@pytest.mark.parametrize("control", list(Control))
@pytest.mark.parametrize("situation", list(SITUATIONS))
def test_a_control_does_what_the_table_says(shard_queue: ShardQueue, situation: str, control: Control) -> None:
    state, reach = SITUATIONS[situation]
    driver = Driver(shard_queue, "t")
    reach(driver)
    assert driver.state == state
    expected = CONTROL_TRANSITIONS[control].get(state)
    if expected is None:
        with pytest.raises(InvalidTransition):
            {"pause": shard_queue.pause, "resume": shard_queue.resume, "cancel": shard_queue.cancel}[control]("t")
        assert driver.state == state
        return
    now = {"pause": shard_queue.pause, "resume": shard_queue.resume, "cancel": shard_queue.cancel}[control]("t")
    assert now == driver.state
    if state in IN_FLIGHT and now == state:  # it waits for the work in flight to end
        driver.finish_in_flight()
    assert driver.state == expected


@pytest.mark.parametrize("situation", ["being planned", "running a unit"])
def test_a_resume_drops_a_pause_that_still_waits(shard_queue: ShardQueue, situation: str) -> None:
    driver = Driver(shard_queue, "t")
    SITUATIONS[situation][1](driver)
    shard_queue.pause("t")
    assert shard_queue.trial("t").control == "pause"
    shard_queue.resume("t")
    driver.finish_in_flight()
    assert driver.state == S.RUNNABLE == after_unit(SITUATIONS[situation][0], UnitEnd.PLANNED
                                                     if situation == "being planned" else UnitEnd.DONE)


@pytest.mark.parametrize("waiting", [None, Control.PAUSE, Control.CANCEL])
@pytest.mark.parametrize(("state", "end"), [(state, end) for state, ends in UNIT_TRANSITIONS.items()
                                             for end in ends])
def test_the_end_of_a_unit_leads_where_the_table_says(shard_queue: ShardQueue, state: TrialState, end: UnitEnd,
                                                      waiting: Control | None) -> None:
    driver = Driver(shard_queue, "t")
    (driver.claim_plan if state == S.PLANNING else driver.running)()
    if waiting is not None:
        {"pause": shard_queue.pause, "cancel": shard_queue.cancel}[waiting]("t")
        assert driver.state == state  # it waits
    driver.end(end)
    assert driver.state == after_unit(state, end, waiting)


def test_no_unit_can_end_where_none_is_in_flight() -> None:
    for state in set(TrialState) - set(UNIT_TRANSITIONS):
        with pytest.raises(InvalidTransition):
            after_unit(state, UnitEnd.DONE)


def test_the_ui_offers_the_controls_that_change_something() -> None:
    offered = {state: [c.value for c in Control if control_changes(state, c)] for state in TrialState}
    assert offered == {
        S.PLANNING: ["pause", "cancel"], S.RUNNABLE: ["pause", "cancel"], S.RUNNING: ["pause", "cancel"],
        S.PAUSED: ["resume", "cancel"], S.FINISHED: [], S.FAILED: [], S.CANCELLED: [],
        S.PRUNED: [],
    }


def test_a_job_round_trips_and_a_bad_one_is_refused_with_its_reason() -> None:
    trial = TrialSpec(data=DataSpec(tokens_path="/data/tokens.npy"), steps=3)
    for job in (EngineJob(trial=trial, budget="auto"), SyntheticJob(units=2, unit_ms=5.0, fail_at_unit=1)):
        assert job_from_dict(job.to_dict()) == job
    bad = {
        "kind 'gpu' is unknown": {"kind": "gpu"},
        "lacks 'trial'": {"kind": "engine"},
        "engine job is invalid": {"kind": "engine", "trial": {**trial.to_dict(), "steps": 0}},
        "at least one unit": {"kind": "synthetic", "units": 0},
        "must be a number of milliseconds": {"kind": "synthetic", "units": 1, "unit_ms": -1},
        "a mapping": ["engine"],
    }
    for reason, raw in bad.items():
        with pytest.raises(JobError, match=reason):
            job_from_dict(raw)  # type: ignore[arg-type]


def test_a_dpo_job_round_trips_and_bad_dpo_settings_are_refused_with_their_reason() -> None:
    trial = TrialSpec(data=DataSpec(examples_dir="/data/pairs", train_examples=8, pairs=True), batch_size=8,
                      micro_batches=2, dpo=DpoSpec(beta=0.3, loss_type="ipo"))
    job = EngineJob(trial=trial)
    assert job_from_dict(json.loads(json.dumps(job.to_dict()))) == job
    raw = job.to_dict()
    bad = {
        "beta must be a positive number": {**raw["trial"], "dpo": {"beta": -0.1}},
        "loss_type 'kto' is not one of sigmoid, ipo": {**raw["trial"], "dpo": {"loss_type": "kto"}},
        "unexpected keyword argument 'gamma'": {**raw["trial"], "dpo": {"gamma": 1.0}},
        "set both dpo and data.pairs": {**raw["trial"], "dpo": None},
        "gives 3 rows, an odd number": {**raw["trial"], "batch_size": 6},
    }
    for reason, trial_raw in bad.items():
        with pytest.raises(JobError, match=reason):
            job_from_dict({**raw, "trial": trial_raw})


def test_a_stored_job_that_cannot_be_read_fails_its_trial_not_the_device(shard_queue: ShardQueue) -> None:
    shard_queue.submit(trial_id="bad", job=SyntheticJob(units=1), export_dir="")
    shard_queue.submit(trial_id="good", job=SyntheticJob(units=1), export_dir="")
    shard_queue.client.hset(shard_queue.key("trial:bad"), "job", '{"kind": "gpu"}')
    shard_queue.device_start(DEVICE, EPOCH)
    loop = DeviceLoop(queue=shard_queue, runners={"synthetic": SyntheticRunner()},
                      config=DeviceLoopConfig(device=DEVICE, epoch=EPOCH, idle_wait_s=0.01))
    try:
        for _ in range(6):  # plan both, run the good one's unit
            assert loop.turn()
    finally:
        loop.keeper.stop()
    bad, good = shard_queue.trial("bad"), shard_queue.trial("good")
    assert bad.state == S.FAILED and "job kind 'gpu' is unknown" in bad.message
    assert good.state == S.FINISHED
