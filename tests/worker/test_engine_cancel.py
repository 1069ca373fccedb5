"""Cancelling an engine trial while one of its units runs on a real device worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.worker.test_engine_trials import tiny_trial
from worker.contract import EngineJob

pytestmark = pytest.mark.timeout(180)

UNIT = 1  # the second unit of the first micro-batch: F1 or FB1 (either passes mid-forward), whatever the plan


def test_a_cancel_during_a_unit_stops_the_trial_at_that_units_end_and_frees_its_spill_store(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    # The worker stops inside the unit (a fault point that blocks until released), so the cancel lands
    # while the unit runs, however fast or slow this machine is.
    signals = tmp_path / "fault"
    workers = device_workers("cpu0", env={"HYDRA_FAULT": f"mid-forward@{UNIT}", "HYDRA_FAULT_DIR": str(signals)})
    queue = workers.queue
    queue.submit(trial_id="c", job=EngineJob(trial=tiny_trial(tokens, seed=3, lr=1e-3, steps=20)),
                 export_dir=str(tmp_path / "export-c"))
    workers.wait(lambda: (signals / "reached").exists(), 60, f"unit {UNIT} to reach its fault point")
    assert json.loads((signals / "reached").read_text())["unit"] == UNIT
    running = queue.trial("c")
    assert (running.state, running.units_done, running.device) == ("running", UNIT, "cpu0")
    assert (workers.spill_dir / "c").is_dir()

    assert queue.cancel("c") == "running"  # it takes effect when the unit in flight ends
    (signals / "release").touch()
    record = workers.wait_for_records(["c"], {"cancelled", "finished", "failed"}, 60)["c"]

    assert (record.state, record.units_done) == ("cancelled", UNIT + 1), record.message
    spans = [s for s in workers.entries("spans") if s["trial"] == "c" and s["phase"] != "plan"]
    assert sorted(s["unit"] for s in spans) == list(range(UNIT + 1))  # the unit in flight ended; none ran after
    assert [e["state"] for e in workers.entries("events") if e["trial"] == "c"][-1] == "cancelled"
    workers.wait(lambda: not (workers.spill_dir / "c").exists(), 30, "the cancelled trial's spill store to be freed")
    assert not (tmp_path / "export-c").exists()
