"""The estimate's pure parts: long workloads replayed in chunks, many trials replayed only as far as the
scheduling rule first reaches, and devices that no longer serve the host."""

from __future__ import annotations

import dataclasses

from webapp.labqueue.estimates import MAX_REPLAY_TRIALS, estimate, loads_of, scheduling_order
from worker.contract import TrialRecord

NOW = 1_000_000.0


def record(trial_id: str, *, state: str = "runnable", units: int = 10, unit_s: float = 1.0, team: str = "1",
           device: str = "", priority: int = 1) -> TrialRecord:
    return TrialRecord(trial_id=trial_id, state=state, message="", control="", device=device, last_device="",
                       remaining_units=units, unit_s=unit_s, remaining_s=units * unit_s, units_done=0, requeues=0,
                       replans=0, submitted=0.0, updated=0.0, export_dir="", job={}, plan=None, team=team,
                       priority=priority)


def test_long_workloads_are_replayed_in_chunks_that_keep_each_trials_time() -> None:
    records = [record("a", units=1_000_000, unit_s=0.5), record("b", units=3_000, unit_s=2.0),
               record("c", state="paused"), record("d", state="planning", units=0)]
    loads = loads_of(records, max_units=1000)
    assert [load.trial_id for load in loads] == ["a", "b"]
    assert sum(load.units for load in loads) <= 1000 + len(loads)
    for load, r in zip(loads, records, strict=False):
        assert load.units * load.unit_s == r.remaining_units * r.unit_s


def test_without_a_device_serving_the_host_nothing_is_timed() -> None:
    devices = {"cpu0": {"epoch": "1", "stop": "0", "seen": str(NOW - 3600)},
               "cpu1": {"epoch": "1", "stop": "1", "seen": str(NOW)}}
    found = estimate([record("a", state="running", device="cpu0"), record("b")], devices, {}, NOW)
    assert [(d.name, d.online) for d in found.devices] == [("cpu0", False), ("cpu1", False)]
    assert [(w.record.trial_id, w.reason, w.timing) for w in found.waiting] == [("b", "no_device", None)]
    assert found.end_s("a") is None


def test_a_trial_that_takes_a_device_at_the_next_boundary_is_next() -> None:
    devices = {name: {"epoch": "1", "stop": "0", "seen": str(NOW)} for name in ("cpu0", "cpu1")}
    found = estimate([record("a", state="running", device="cpu0", units=4), record("b", units=2)], devices, {}, NOW)
    [waiting] = found.waiting
    assert (waiting.reason, waiting.timing.start_s, waiting.timing.end_s) == ("next", 0.0, 2.0)
    assert found.end_s("a") == 4.0


def test_the_scheduling_order_takes_running_trials_then_each_teams_first_in_turn_by_weight() -> None:
    records = [record("a1", units=5), record("a2", units=9), record("a3", units=1, priority=2),
               record("a4", state="running", device="cpu0", units=2), record("b1", team="2", units=3),
               record("b2", team="2", units=4), record("p", state="paused"), record("q", state="planning", units=0)]
    order = [r.trial_id for r in scheduling_order(records, {"1": 2.0, "2": 1.0})]
    # team 1 weighs twice team 2: it takes two turns to team 2's one (ties to the smaller name); in a team the
    # higher priority, then the longer remaining time first
    assert order == ["a4", "a3", "b2", "a2", "a1", "b1"]


def test_past_the_replay_limit_the_trials_reached_first_keep_their_starts_and_the_rest_wait_after_them() -> None:
    devices = {"cpu0": {"epoch": "1", "stop": "0", "seen": str(NOW)}}
    records = [record(name, units=units) for name, units in [("e", 2), ("a", 10), ("d", 4), ("b", 8), ("c", 6)]]
    whole = estimate(records, devices, {}, NOW)
    cut = estimate(records, devices, {}, NOW, max_trials=3)
    assert (whole.replayed, whole.left_out, whole.ends_at_least) == (5, 0, False)
    assert (cut.replayed, cut.left_out, cut.ends_at_least) == (3, 2, True)
    assert [(w.record.trial_id, w.reason) for w in cut.waiting] == [
        ("a", "next"), ("b", "team_order"), ("c", "team_order"), ("d", "later"), ("e", "later")]
    assert cut.waiting[3].detail.startswith("Runs after the 3 trials the scheduling rule reaches first")
    # the shorter trials left out start only once the longer ones are down to their length (Sharded-LRTF)...
    for name in "abc":
        assert cut.timings[name].start_s == whole.timings[name].start_s
    # ...and then share the device: without them, the ends are earlier than they will be
    assert all(cut.timings[name].end_s <= whole.timings[name].end_s for name in "abc")
    assert [w.timing for w in cut.waiting[3:]] == [None, None]
    ends_only = estimate(records, devices, {}, NOW, max_trials=3, waiting=False)  # what a trial list asks
    assert (ends_only.timings, ends_only.waiting, ends_only.ends_at_least) == (cut.timings, [], True)


def test_a_thousand_trials_are_replayed_no_further_than_the_limit() -> None:
    devices = {name: {"epoch": "1", "stop": "0", "seen": str(NOW)} for name in ("cpu0", "cpu1")}
    records = [record(str(n), units=100 + n, team=str(n % 3)) for n in range(1000)]
    found = estimate(records, devices, {}, NOW)
    assert (found.replayed, found.left_out) == (MAX_REPLAY_TRIALS, 1000 - MAX_REPLAY_TRIALS)
    assert len(found.timings) == MAX_REPLAY_TRIALS and len(found.waiting) == 1000
    assert [w.reason for w in found.waiting[MAX_REPLAY_TRIALS:]] == ["later"] * (1000 - MAX_REPLAY_TRIALS)
    assert set(found.timings) == {r.trial_id for r in scheduling_order(records, {})[:MAX_REPLAY_TRIALS]}


def test_a_trial_on_two_devices_shows_on_both_and_says_why_and_a_narrow_one_says_why_not() -> None:
    devices = {name: {"epoch": "1", "stop": "0", "seen": str(NOW)} for name in ("cpu0", "cpu1", "cpu2")}

    def running(trial_id: str, on: list[str], *, micro_batches: int = 4, width: int = 4, cap: int = 4,
                shards: int = 3, dpo: bool = False) -> TrialRecord:
        r = record(trial_id, state="running", device=on[0])
        return dataclasses.replace(r, devices=on, width=width, width_cap=cap,
                                   job={"trial": {"micro_batches": micro_batches,
                                                  "dpo": {"beta": 0.1} if dpo else None}},
                                   plan={"shards": [{"index": n} for n in range(shards)]})

    found = estimate([running("a", ["cpu0", "cpu1"])], devices, {}, NOW)
    assert [(d.name, d.trial.trial_id if d.trial else None, d.spread) for d in found.devices] == [
        ("cpu0", "a", "on 2 devices: no other trial is waiting"),
        ("cpu1", "a", "on 2 devices: no other trial is waiting"), ("cpu2", None, "")]
    reasons = [
        ("one micro-batch a step", running("b", ["cpu0"], micro_batches=1, width=1, cap=1)),
        ("its experiment allows one device", running("b", ["cpu0"], width=1, cap=1)),
        ("next micro-batch cannot start yet", running("b", ["cpu0"], shards=1, dpo=True)),  # spreads as any other
        ("next micro-batch cannot start yet", running("b", ["cpu0"], shards=1, micro_batches=2, width=2, cap=2)),
        ("next micro-batch cannot start yet", running("b", ["cpu0"], shards=1)),  # one shard spreads too
        ("memory holds its state for one micro-batch at a time", running("b", ["cpu0"], width=1)),
        ("next micro-batch cannot start yet", running("b", ["cpu0"])),
    ]
    for why, trial in reasons:
        assert why in estimate([trial], devices, {}, NOW).devices[0].spread
    assert estimate([running("b", ["cpu0"]), record("c")], devices, {}, NOW).devices[0].spread == (
        "on one device: other trials are waiting")
