"""Sharing a host between teams on real device workers: fair share, and admission by the host tier's memory.

Team alpha fills both devices with long trials; team beta submits short ones a little later. Beta's first
unit starts within a unit time of the boundary after its arrival (not after alpha's trials end), both teams
then share the devices, and every trial ends with the numbers of training alone.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from benchmarks.lora_sharing import tree_bytes
from tests.worker.test_engine_trials import assert_trained_like_plain_pytorch, tiny_trial
from worker.contract import EngineJob, SyntheticJob
from worker.engine.session import TrialSession, trial_create

pytestmark = [pytest.mark.timeout(240), pytest.mark.processes]


def spans_of(workers, trial_ids) -> list[dict]:
    return sorted((s for s in workers.entries("spans") if s["trial"] in trial_ids and s["shard"] != -1),
                  key=lambda s: float(s["start"]))


def test_a_late_team_is_served_at_the_next_unit_boundary_and_then_shares_the_devices(device_workers) -> None:
    workers = device_workers("cpu0", "cpu1")
    for i in range(4):
        workers.queue.submit(trial_id=f"a{i}", job=SyntheticJob(units=40, unit_ms=50), export_dir="", team="alpha")
    workers.wait(lambda: len(spans_of(workers, {f"a{i}" for i in range(4)})) >= 8, 60, "alpha's trials to run")
    arrived = max(float(s["end"]) for s in spans_of(workers, {f"a{i}" for i in range(4)}))
    for i in range(2):
        workers.queue.submit(trial_id=f"b{i}", job=SyntheticJob(units=6, unit_ms=50), export_dir="", team="beta")
    records = workers.wait_for_records([f"b{i}" for i in range(2)], {"finished", "failed"}, 120)
    assert {r.state for r in records.values()} == {"finished"}
    beta = spans_of(workers, {"b0", "b1"})
    # Planning the two trials takes the devices first; then beta runs within a unit or two of alpha's.
    alpha_running = [s for s in spans_of(workers, {f"a{i}" for i in range(4)}) if float(s["start"]) > arrived]
    first_beta = float(beta[0]["start"])
    assert sum(float(s["start"]) < first_beta for s in alpha_running) <= 2 * 2  # at most a unit per device
    # While both teams have work, beta gets about half the units (12 units of beta's against alpha's).
    window = [s for s in spans_of(workers, {f"a{i}" for i in range(4)} | {"b0", "b1"})
              if first_beta <= float(s["start"]) <= float(beta[-1]["start"])]
    share = sum(s["trial"].startswith("b") for s in window) / len(window)
    assert 0.35 <= share <= 0.65, share


def test_trials_of_two_teams_sharing_the_devices_each_train_as_alone(device_workers, tokens: str,
                                                                     tmp_path: Path) -> None:
    workers = device_workers("cpu0", "cpu1")
    trials = {"a0": ("alpha", tiny_trial(tokens, seed=1, lr=2e-3, steps=4)),
              "a1": ("alpha", tiny_trial(tokens, seed=2, lr=3e-3, steps=4)),
              "b0": ("beta", tiny_trial(tokens, seed=3, lr=4e-3, steps=2))}
    for trial_id, (team, trial) in trials.items():
        workers.queue.submit(trial_id=trial_id, job=EngineJob(trial=trial), team=team,
                             export_dir=str(tmp_path / "exports" / trial_id))
    records = workers.wait_for_records(trials, {"finished", "failed"}, 180)
    assert {r.state for r in records.values()} == {"finished"}, [r.message for r in records.values()]
    for trial_id, (_, trial) in trials.items():
        assert_trained_like_plain_pytorch(workers, trial_id, trial, tmp_path)


def peak_store_bytes(trial, root: Path) -> int:
    """The most bytes the trial's spill store takes while it trains alone (sampled in a thread)."""
    trial_create(spec=trial, spill_dir=root, trial_id="probe", device=torch.device("cpu"))
    session = TrialSession.open(spill_dir=root, trial_id="probe", device=torch.device("cpu"))
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_bytes(root / "probe"))
            done.wait(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        while session.next_unit() is not None:
            session.run_unit()
    finally:
        done.set()
        sampler.join()
    return peak[0]


def test_trials_beyond_the_host_tier_s_capacity_wait_and_all_finish_within_it(device_workers, tokens: str,
                                                                             tmp_path: Path) -> None:
    """Four trials whose stores take more than the host tier may hold: at most two are admitted at once, the
    others wait to be planned (never fail), the spill directory never holds more than the capacity, and
    every trial trains as alone."""
    trials = {f"m{i}": tiny_trial(tokens, seed=i, lr=2e-3, steps=2) for i in range(4)}
    size = int(1.2 * peak_store_bytes(trials["m0"], tmp_path / "probe"))  # the trials are of one shape
    capacity = int(2.5 * size)
    workers = device_workers("cpu0", "cpu1", env={"HYDRA_SPILL_CAPACITY_BYTES": str(capacity)})
    for trial_id, trial in trials.items():
        workers.queue.submit(trial_id=trial_id, job=EngineJob(trial=trial), host_bytes=size,
                             export_dir=str(tmp_path / "exports" / trial_id))
    peak, waited = 0, False
    while {workers.queue.trial(t).state for t in trials} - {"finished", "failed"}:
        peak = max(peak, tree_bytes(workers.spill_dir))
        waited = waited or any("host memory" in workers.queue.trial(t).message for t in trials)
        time.sleep(0.02)
    records = {t: workers.queue.trial(t) for t in trials}
    assert {r.state for r in records.values()} == {"finished"}, [r.message for r in records.values()]
    assert waited and 0 < peak <= capacity, (peak, capacity)
    for trial_id, trial in trials.items():
        assert_trained_like_plain_pytorch(workers, trial_id, trial, tmp_path)
