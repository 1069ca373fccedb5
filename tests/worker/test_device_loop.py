"""The device loop in this process, against real Redis (worker/scheduling/device_loop.py)."""

from __future__ import annotations

import time

from worker.contract import SyntheticJob
from worker.scheduling.device_loop import DeviceLoop, DeviceLoopConfig, LeaseKeeper
from worker.scheduling.queue import ShardQueue
from worker.scheduling.synthetic import SyntheticRunner


def test_it_renews_the_held_lease_until_the_unit_ends() -> None:
    renewals: list[float] = []
    keeper = LeaseKeeper()
    try:
        with keeper.holding(lambda: renewals.append(time.monotonic()) or True, 0.3, "t1"):
            time.sleep(0.35)
        held = len(renewals)
        time.sleep(0.25)
    finally:
        keeper.stop()
    assert held >= 2
    assert len(renewals) == held


def test_a_shorter_lease_taken_while_the_keeper_sleeps_on_a_longer_one_is_renewed_in_time() -> None:
    renewals: list[str] = []
    keeper = LeaseKeeper()
    try:
        with keeper.holding(lambda: renewals.append("long") or True, 30.0, "t1"):
            time.sleep(0.05)  # the keeper now sleeps until 10 s from now
        with keeper.holding(lambda: renewals.append("short") or True, 0.3, "t2"):
            time.sleep(0.35)
    finally:
        keeper.stop()
    assert renewals.count("short") >= 2 and "long" not in renewals


def test_it_stops_renewing_a_lost_lease() -> None:
    calls: list[int] = []
    keeper = LeaseKeeper()
    try:
        with keeper.holding(lambda: calls.append(1) and False, 0.15, "t1"):
            time.sleep(0.3)
    finally:
        keeper.stop()
    assert calls == [1]


class RecordingRunner(SyntheticRunner):
    def __init__(self) -> None:
        self.guesses: list[tuple[str, str | None]] = []

    def run_unit(self, *, trial_id: str, job, units_done: int, next_trial: str | None, token: int):
        self.guesses.append((trial_id, next_trial))
        return super().run_unit(trial_id=trial_id, job=job, units_done=units_done, next_trial=next_trial,
                                token=token)


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
