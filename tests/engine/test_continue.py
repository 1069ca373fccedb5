"""Continuing an ended trial: a trial trained 20 steps, checkpointed as it ended, and continued 10 steps under a
schedule of their own gives the losses, evaluations, weights and optimizer state of one trained 30 steps whose
spec held both segments from the start, bit for bit; and what is not such a continuation is refused."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from tests.engine.conftest import CPU, run_all, tiny_spec
from tests.engine.test_resume import CUTS, weights
from worker.engine import TrialSession, trial_create
from worker.engine.config import ContinuationSpec, ScheduleSpec, TrialSpec
from worker.engine.durable import checkpoint, continue_from_checkpoint, latest
from worker.engine.errors import SpecError, SpillStoreError
from worker.engine.schedule import Timetable, lr_factor, step_lr

ADDED = ContinuationSpec(after=20, steps=10, lr=1e-3, warmup_steps=2, decay="linear")


@dataclasses.dataclass
class Run:
    losses: list[float]
    evals: list[tuple[int, float]]
    lrs: list[float]
    final: Path
    state: dict[str, bytes]  # every shard's parameters and optimizer state


def train(session: TrialSession, into: Run) -> None:
    for result in run_all(session):
        if result.loss is not None:
            into.losses.append(result.loss)
            into.lrs.append(result.lr)
        if result.eval_loss is not None:
            into.evals.append((result.unit.step, result.eval_loss))


def finish(session: TrialSession, run: Run) -> None:
    session.export(run.final)
    names = [f"{kind}{s}" for s in range(len(session.plan.shards)) for kind in "pmv"]
    run.state = {name: session.store.path(name).read_bytes() for name in names}


def whole(spec: TrialSpec, root: Path) -> Run:
    trial_create(spec=spec, spill_dir=root, trial_id="whole", device=CPU, cuts=CUTS)
    session = TrialSession.open(spill_dir=root, trial_id="whole", device=CPU)
    run = Run([], [], [], root / "final", {})
    train(session, run)
    finish(session, run)
    return run


def continued(first: TrialSpec, spec: TrialSpec, root: Path) -> Run:
    """Train `first`, checkpoint it as it ends and free its store (as a worker does), then continue it as `spec`."""
    spill, disk = root / "spill", root / "checkpoints"
    trial_create(spec=first, spill_dir=spill, trial_id="ended", device=CPU, cuts=CUTS)
    session = TrialSession.open(spill_dir=spill, trial_id="ended", device=CPU)
    run = Run([], [], [], root / "final", {})
    train(session, run)
    session.close()
    assert checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="ended") is not None
    shutil.rmtree(spill / "ended")

    continue_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, source_id="ended", trial_id="more", spec=spec)
    assert latest(disk, "ended") is not None, "the ended trial's checkpoint stays"
    again = TrialSession.open(spill_dir=spill, trial_id="more", device=CPU)
    assert again.cursor == Timetable.of(spec, shards=len(CUTS)).step_offset(ADDED.after)
    assert again.remaining_units() > 0 and again.state.last_unit == -1
    train(again, run)
    finish(again, run)
    return run


@pytest.mark.parametrize("eval_every", [5, 0], ids=["evaluated", "no-evaluations"])
def test_a_trial_trained_20_steps_and_continued_10_equals_one_trained_30_with_the_same_schedule(
        tokens_path: Path, tmp_path: Path, eval_every: int) -> None:
    first = tiny_spec(tokens_path, eval_every=eval_every)
    spec = dataclasses.replace(first, continuations=(ADDED,))
    assert spec.total_steps == 30
    reference = whole(spec, tmp_path / "whole")
    run = continued(first, spec, tmp_path / "continued")

    assert len(run.losses) == 30
    assert run.losses == reference.losses
    assert run.evals == reference.evals
    if eval_every:
        assert [step for step, _ in run.evals] == [4, 9, 14, 19, 24, 29]
    assert run.lrs == reference.lrs == [step_lr(spec, step) for step in range(30)]
    for name, tensor in weights(reference.final).items():
        assert torch.equal(weights(run.final)[name], tensor), name
    assert run.state.keys() == reference.state.keys()
    for name, data in reference.state.items():
        assert run.state[name] == data, name


def test_the_first_segment_keeps_its_schedule_and_an_added_one_has_its_own(tokens_path: Path) -> None:
    plain = tiny_spec(tokens_path)
    spec = dataclasses.replace(plain, continuations=(ADDED,))
    for step in range(20):  # the arithmetic of a trial never continued, unchanged
        assert step_lr(spec, step) == step_lr(plain, step) == plain.optimizer.lr * lr_factor(plain.schedule, step, 20)
    assert step_lr(spec, 20) == 0.0  # its own warm-up from 0
    assert step_lr(spec, 21) == ADDED.lr * 0.5
    assert step_lr(spec, 22) == ADDED.lr * lr_factor(ScheduleSpec(warmup_steps=2, decay="linear"), 2, 10)
    assert TrialSpec.from_dict(spec.to_dict()) == spec
    assert "continuations" not in plain.to_dict()


def test_segments_must_follow_the_steps_trained(tokens_path: Path) -> None:
    with pytest.raises(SpecError, match="must start after"):
        tiny_spec(tokens_path, continuations=(dataclasses.replace(ADDED, after=21),))
    with pytest.raises(SpecError, match="at least one step"):
        ContinuationSpec(after=20, steps=0, lr=1e-3)
    with pytest.raises(SpecError, match="learning rate"):
        ContinuationSpec(after=20, steps=5, lr=0.0)


def test_what_is_not_that_trial_with_steps_added_is_refused(tokens_path: Path, tmp_path: Path) -> None:
    spill, disk = tmp_path / "spill", tmp_path / "checkpoints"
    first = tiny_spec(tokens_path, steps=4, eval_every=2)
    with pytest.raises(SpillStoreError, match="no checkpoint"):
        continue_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, source_id="ended", trial_id="more",
                                 spec=dataclasses.replace(first, continuations=(dataclasses.replace(ADDED, after=4),)))
    trial_create(spec=first, spill_dir=spill, trial_id="ended", device=CPU, cuts=CUTS)
    session = TrialSession.open(spill_dir=spill, trial_id="ended", device=CPU)
    session.run_unit()
    checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="ended")
    added = dataclasses.replace(ADDED, after=4)
    with pytest.raises(SpillStoreError, match="not of its end"):
        continue_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, source_id="ended", trial_id="more",
                                 spec=dataclasses.replace(first, continuations=(added,)))
    run_all(session)
    checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="ended")
    with pytest.raises(SpecError, match="specs differ"):
        continue_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, source_id="ended", trial_id="more",
                                 spec=dataclasses.replace(first, seed=8, continuations=(added,)))
    with pytest.raises(SpecError, match="trained 4 steps"):
        continue_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, source_id="ended", trial_id="more",
                                 spec=dataclasses.replace(first, continuations=(dataclasses.replace(ADDED, after=3),)))
    assert not (spill / "more").exists(), "a refused continuation leaves no store"
