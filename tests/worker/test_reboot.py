"""A host reboot on real device workers: the spill directory (host RAM) vanishes mid-training.

A trial with durable checkpoints is restored from its last one and finishes with the weights of training
alone (a run restarted from a checkpoint is exact, so it is that run); a trial without a checkpoint fails
with the reason."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.plain_pytorch import assert_bit_identical, exported_weights, plain_reference
from tests.worker.test_engine_trials import tiny_trial
from worker.contract import EngineJob

pytestmark = [pytest.mark.timeout(240), pytest.mark.processes]


def test_trials_resume_from_their_checkpoints_after_the_spill_directory_is_wiped(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    kept = tiny_trial(tokens, seed=5, lr=2e-3, steps=14)
    lost = tiny_trial(tokens, seed=6, lr=2e-3, steps=14)
    workers = device_workers("cpu0")
    exports = tmp_path / "exports"
    # A checkpoint every 0.1 s of training: several before the wipe, each restored state a different step.
    workers.queue.submit(trial_id="kept", job=EngineJob(trial=kept, checkpoint_minutes=0.1 / 60),
                         export_dir=str(exports / "kept"))
    workers.queue.submit(trial_id="lost", job=EngineJob(trial=lost, checkpoint_minutes=0),
                         export_dir=str(exports / "lost"))

    def checkpointed_steps() -> list[int]:
        return [int(c["step"]) for c in workers.entries("checkpoints") if c["trial"] == "kept"]

    def trained(trial_id: str) -> int:
        return len([s for s in workers.entries("steps") if s["trial"] == trial_id])

    workers.wait(lambda: any(step >= 3 for step in checkpointed_steps()) and trained("lost") >= 2, 120,
                 "a checkpoint of trial kept after step 3 and two steps of trial lost")
    assert trained("kept") < kept.steps and trained("lost") < lost.steps, "the wipe must come mid-training"
    # The reboot: the whole spill directory goes at once (a rename, so that no half-deleted store is seen).
    os.rename(workers.spill_dir, tmp_path / "gone")
    shutil.rmtree(tmp_path / "gone")

    records = workers.wait_for_records(["kept", "lost"], {"finished", "failed"}, 180)
    assert records["kept"].state == "finished", records["kept"].message
    assert records["lost"].state == "failed"
    assert "the spill store of trial lost is gone (host restarted?) and it has no checkpoint" in records["lost"].message
    log = (workers.root / "cpu0.log").read_text()
    assert "trial kept: its spill store was gone; restored from its checkpoint of step" in log

    reference = plain_reference(kept, tmp_path / "plain")
    losses = {(int(s["step"]), float(s["loss"])) for s in workers.entries("steps") if s["trial"] == "kept"}
    assert sorted(losses) == list(enumerate(reference.losses))  # steps re-run after the restore: the same losses
    assert_bit_identical(exported_weights(exports / "kept"), reference.weights)
    # The finished trial's last checkpoint is kept on disk beside its export; the failed one has none.
    checkpoints = workers.root / "data" / "checkpoints"
    workers.wait(lambda: max(checkpointed_steps()) == kept.steps, 30, "the finished trial's last checkpoint")
    assert [p.name for p in (checkpoints / "kept").iterdir() if p.name.startswith("ckpt-")]
    assert not (checkpoints / "lost").exists()
