"""The estimate's pure parts: long workloads replayed in chunks, and devices that no longer serve the host."""

from __future__ import annotations

from webapp.labqueue.estimates import estimate, loads_of
from worker.contract import TrialRecord

NOW = 1_000_000.0


def record(trial_id: str, *, state: str = "runnable", units: int = 10, unit_s: float = 1.0, team: str = "1",
           device: str = "") -> TrialRecord:
    return TrialRecord(trial_id=trial_id, state=state, message="", control="", device=device, last_device="",
                       remaining_units=units, unit_s=unit_s, remaining_s=units * unit_s, units_done=0, requeues=0,
                       replans=0, submitted=0.0, updated=0.0, export_dir="", job={}, plan=None, team=team)


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
