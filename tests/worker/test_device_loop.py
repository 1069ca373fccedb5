"""The device loop in this process, against real Redis (worker/scheduling/device_loop.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from worker.contract import SyntheticJob
from worker.scheduling.device_loop import DeviceLoop, DeviceLoopConfig, LeaseKeeper
from worker.scheduling.queue import ShardQueue
from worker.scheduling.synthetic import SyntheticRunner


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll `condition`; the timeout only bounds a broken keeper, it is not what a passing test waits for."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.01)


# The keeper renews every third of a lease. These tests wait for renewals to happen rather than sleeping a
# lease's length and counting: a slow machine makes them wait longer, not fail. Where a test checks that
# something did not happen, a second keeper holding a lease of the same length is its clock: when that one
# has renewed ten times, the keeper under test has had ten periods to do what it must not.


def ten_periods_pass(lease_s: float) -> None:
    """Return once a keeper of its own has renewed a lease of `lease_s` ten times."""
    ticks: list[int] = []
    metronome = LeaseKeeper()
    try:
        with metronome.holding(lambda: ticks.append(1) or True, lease_s, "metronome"):
            wait_until(lambda: len(ticks) >= 10, "ten renewals of the metronome's lease")
    finally:
        metronome.stop()


def test_it_renews_the_held_lease_until_the_unit_ends() -> None:
    renewals: list[float] = []
    keeper = LeaseKeeper()
    try:
        with keeper.holding(lambda: renewals.append(time.monotonic()) or True, 0.3, "t1"):
            wait_until(lambda: len(renewals) >= 3, "three renewals")
        held = len(renewals)
        ten_periods_pass(0.3)  # a renewal already under way when the unit ended lands meanwhile
        after = len(renewals)
        ten_periods_pass(0.3)
    finally:
        keeper.stop()
    assert after <= held + 1
    assert len(renewals) == after


def test_a_shorter_lease_taken_while_the_keeper_sleeps_on_a_longer_one_is_renewed_in_time() -> None:
    renewals: list[str] = []
    keeper = LeaseKeeper()
    try:
        with keeper.holding(lambda: renewals.append("long") or True, 300.0, "t1"):
            time.sleep(0.05)  # the keeper now sleeps until 100 s from now
        with keeper.holding(lambda: renewals.append("short") or True, 0.3, "t2"):
            # Well within the 100 s the keeper would sleep if taking the short lease had not woken it.
            wait_until(lambda: renewals.count("short") >= 2, "two renewals of the short lease")
    finally:
        keeper.stop()
    assert "long" not in renewals


def test_it_stops_renewing_a_lost_lease() -> None:
    calls: list[int] = []
    keeper = LeaseKeeper()
    try:
        with keeper.holding(lambda: calls.append(1) and False, 0.15, "t1"):
            wait_until(lambda: len(calls) >= 1, "the first renewal")
            ten_periods_pass(0.15)
    finally:
        keeper.stop()
    assert calls == [1]


class RecordingRunner(SyntheticRunner):
    def __init__(self) -> None:
        self.guesses: list[tuple[str, str | None]] = []

    def run_unit(self, *, trial_id: str, job, units_done: int, next_trial: str | None, token: int, lane: int = 0,
                 expired: str = ""):
        self.guesses.append((trial_id, next_trial))
        return super().run_unit(trial_id=trial_id, job=job, units_done=units_done, next_trial=next_trial,
                                token=token, lane=lane, expired=expired)


def test_it_plans_runs_and_guesses_the_next_trial(shard_queue: ShardQueue) -> None:
    shard_queue.device_start("cpu0", "e1")
    shard_queue.submit(trial_id="a", job=SyntheticJob(units=2, unit_ms=20), export_dir="")
    shard_queue.submit(trial_id="b", job=SyntheticJob(units=2, unit_ms=20), export_dir="")
    runner = RecordingRunner()
    loop = DeviceLoop(queue=shard_queue, runners={"synthetic": runner},
                      config=DeviceLoopConfig(device="cpu0", epoch="e1", idle_wait_s=0.01))
    try:
        for _ in range(6):  # 2 plans, then 4 units
            assert loop.turn()
    finally:
        loop.keeper.stop()
    assert [shard_queue.trial(t).state for t in "ab"] == ["finished", "finished"]
    # While a's first unit ran (a: 2 units left, ties by id), b was known to come next: 2 units against 1.
    assert runner.guesses[0] == ("a", "b")
    assert runner.guesses[-1][1] is None  # nothing left after the last unit
    shard_queue.device_stop("cpu0")
    assert loop.turn()  # acts on the survey made in the round trip of the last unit's completion, before the stop
    assert not loop.turn()


class ArrivingRunner(SyntheticRunner):
    """Runs units as SyntheticRunner does; during unit `at` of trial `during`, `arrive` changes the queue."""

    def __init__(self, during: str, at: int, arrive: Callable[[], None]) -> None:
        self.during, self.at, self.arrive = during, at, arrive
        self.ran: list[str] = []

    def run_unit(self, *, trial_id: str, job, units_done: int, next_trial: str | None, token: int, lane: int = 0,
                 expired: str = ""):
        self.ran.append(trial_id)
        if (trial_id, units_done) == (self.during, self.at):
            self.arrive()
        return super().run_unit(trial_id=trial_id, job=job, units_done=units_done, next_trial=next_trial,
                                token=token, lane=lane, expired=expired)


def test_a_guess_the_policy_refuses_goes_back_and_the_policy_s_choice_runs(shard_queue: ShardQueue) -> None:
    """The loop claims its guess of the next trial in the completion's round trip; a trial that became the
    policy's choice meanwhile (here one of high priority, planned on another device) runs instead, and the
    guessed trial loses nothing: every trial runs each of its units once."""
    shard_queue.device_start("cpu0", "e1")
    shard_queue.submit(trial_id="a", job=SyntheticJob(units=3), export_dir="")

    def arrive() -> None:
        shard_queue.submit(trial_id="urgent", job=SyntheticJob(units=2), export_dir="", priority="high")
        job = shard_queue.claim_plan("cpu1")
        shard_queue.plan_done(job, remaining_units=2, unit_s=1e-6, plan={})

    runner = ArrivingRunner("a", 0, arrive)
    loop = DeviceLoop(queue=shard_queue, runners={"synthetic": runner},
                      config=DeviceLoopConfig(device="cpu0", epoch="e1", idle_wait_s=0.01))
    try:
        for _ in range(6):  # a's plan, then its first unit, urgent's two, a's last two
            assert loop.turn()
    finally:
        loop.keeper.stop()
    assert runner.ran == ["a", "urgent", "urgent", "a", "a"]
    assert [shard_queue.trial(t).state for t in ("a", "urgent")] == ["finished", "finished"]
    assert shard_queue.trial("a").units_done == 3
    # a went back to the runnable set between its units as if never claimed: no event says it ran again.
    states = [fields["state"] for _, fields in shard_queue.client.xrange(shard_queue.key("events"))
              if fields["trial"] == "a"]
    assert states == ["planning", "runnable", "running", "finished"]
