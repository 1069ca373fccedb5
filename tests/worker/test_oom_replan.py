"""A unit that runs out of device memory re-plans its trial with smaller shards, on real device workers.

No GPU here, so the engine's fault-injection hook plays the part: with HYDRA_FAULT_OOM_ABOVE_BYTES set, a
worker's units whose shard is planned above that many bytes raise torch.OutOfMemoryError just before their
commit, as a device with that much memory would. The trial must come back with a smaller plan and end with
the weights of the same trial trained alone; the trial that fits is not touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.test_engine_trials import assert_same_weights, exported, tiny_trial, trained_alone
from worker.contract import EngineJob
from worker.engine.session import trial_create

pytestmark = pytest.mark.timeout(240)


def test_a_trial_that_runs_out_of_memory_is_replanned_and_stays_exact(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    big = tiny_trial(tokens, seed=3, lr=2e-3, steps=4, budget_bytes=450_000)  # one shard
    small = tiny_trial(tokens, seed=4, lr=1e-3, steps=3, budget_bytes=200_000)  # two shards
    first = trial_create(spec=big, spill_dir=tmp_path / "probe", trial_id="big", device=torch.device("cpu"))
    largest = max(first.unit_peak_bytes(s.index) for s in first.shards)
    limit = largest - 1  # the big trial's fullest shard cannot run; every shard of the small one can
    assert limit >= small.budget_bytes

    workers = device_workers("cpu0", "cpu1", env={"HYDRA_FAULT_OOM_ABOVE_BYTES": str(limit)})
    for trial_id, trial in {"big": big, "small": small}.items():
        workers.queue.submit(trial_id=trial_id, job=EngineJob(trial=trial),
                             export_dir=str(tmp_path / "exports" / trial_id))
    records = workers.wait_for_records(["big", "small"], {"finished", "failed"}, 180)
    assert {t: r.state for t, r in records.items()} == {"big": "finished", "small": "finished"}, \
        [r.message for r in records.values()]

    assert records["small"].replans == 0
    assert records["big"].replans >= 1
    plan = records["big"].plan
    assert plan["budget_bytes"] <= int(big.budget_bytes * 0.75)
    assert len(plan["shards"]) > len(first.shards)
    assert max(s["device_bytes"] + s["activation_bytes"] for s in plan["shards"]) + plan["reserve_bytes"] <= limit

    events = workers.client.xrange(workers.queue.key("events"))
    replanned = [f["message"] for _, f in events if f["trial"] == "big" and f["message"].startswith("re-planned")]
    assert len(replanned) == records["big"].replans
    assert "out-of-memory" in replanned[0] and "fault injection" in replanned[0]
    assert [s["trial"] for s in workers.entries("spans") if s["phase"] == "replan"] == ["big"] * len(replanned)
    steps = sorted((s["trial"], s["step"]) for s in workers.entries("steps"))
    assert steps == [("big", i) for i in range(4)] + [("small", i) for i in range(3)]  # no step twice

    assert_same_weights(exported(tmp_path / "exports" / "big"), trained_alone(big, tmp_path / "alone-big"))
    assert_same_weights(exported(tmp_path / "exports" / "small"), trained_alone(small, tmp_path / "alone-small"))
