"""Continuing ended trials on real device workers: a trial that finished is continued from its last checkpoint
by a trial of a new id (`EngineJob.continue_from`), and its steps, evaluations and weights are those of one
trained with both segments from the start; a trial without a checkpoint cannot be continued."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.plain_pytorch import assert_bit_identical, exported_weights
from tests.worker.test_engine_trials import tiny_trial
from worker.contract import EngineJob
from worker.engine.config import ContinuationSpec

pytestmark = [pytest.mark.timeout(240), pytest.mark.processes]

HOUR = 60.0  # minutes between checkpoints: only the last one, as a trial ends


def test_a_finished_trial_continued_on_workers_equals_one_trained_with_both_segments(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    first = tiny_trial(tokens, seed=3, lr=2e-3, steps=4)
    spec = dataclasses.replace(first, continuations=(
        ContinuationSpec(after=4, steps=3, lr=1e-3, warmup_steps=1, decay="linear"),))
    workers = device_workers("cpu0", "cpu1")
    exports = tmp_path / "exports"

    def submit(trial_id: str, job: EngineJob) -> None:
        workers.queue.submit(trial_id=trial_id, job=job, export_dir=str(exports / trial_id))

    submit("ended", EngineJob(trial=first, checkpoint_minutes=HOUR))
    submit("bare", EngineJob(trial=first, checkpoint_minutes=0))
    submit("whole", EngineJob(trial=spec, checkpoint_minutes=HOUR))
    workers.wait_for_records(["ended", "bare", "whole"], {"finished"}, 120)
    checkpoints = workers.root / "data" / "checkpoints"
    assert (checkpoints / "ended").is_dir()

    submit("ended-c1", EngineJob(trial=spec, continue_from="ended", checkpoint_minutes=HOUR))
    submit("bare-c1", EngineJob(trial=spec, continue_from="bare", checkpoint_minutes=HOUR))
    records = workers.wait_for_records(["ended-c1", "bare-c1"], {"finished", "failed"}, 120)
    assert records["ended-c1"].state == "finished", records["ended-c1"].message
    assert records["bare-c1"].state == "failed"
    assert "cannot continue trial bare: trial bare has no checkpoint to continue from" in records["bare-c1"].message

    def telemetry(kind: str, *trial_ids: str) -> list[tuple[int, float]]:
        return sorted((int(e["step"]), float(e["loss"])) for e in workers.entries(kind) if e["trial"] in trial_ids)

    assert [step for step, _ in telemetry("steps", "ended-c1")] == [4, 5, 6]  # steps count on from the end
    assert telemetry("steps", "ended", "ended-c1") == telemetry("steps", "whole")
    assert telemetry("evals", "ended", "ended-c1") == telemetry("evals", "whole")
    assert_bit_identical(exported_weights(exports / "ended-c1"), exported_weights(exports / "whole"))
    # The continued trial's last checkpoint supersedes the one it started from.
    workers.wait(lambda: not (checkpoints / "ended").exists(), 30, "the superseded checkpoint deleted")
    assert any(p.name.startswith("ckpt-") for p in (checkpoints / "ended-c1").iterdir())
