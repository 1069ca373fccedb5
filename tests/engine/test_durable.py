"""Durable checkpoints: a store rebuilt from its checkpoint after the spill directory is wiped (a reboot)
trains on to the numbers of the uninterrupted run; a snapshot holds its commit while training goes on; a
checkpoint cut off half-way is never restored."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.engine.conftest import CPU, run_all, tiny_spec
from tests.engine.test_resume import CUTS, weights
from worker.engine import TrialSession, trial_create
from worker.engine.durable import (
    SNAPSHOTS,
    checkpoint,
    latest,
    restore_from_checkpoint,
    snapshot,
    sweep_snapshots,
)
from worker.engine.errors import SpillStoreError


@pytest.fixture(scope="module")
def uninterrupted(tokens_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[float], Path]:
    root = tmp_path_factory.mktemp("uninterrupted")
    trial_create(spec=tiny_spec(tokens_path), spill_dir=root, trial_id="t", device=CPU, cuts=CUTS)
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    losses = [r.loss for r in run_all(session) if r.loss is not None]
    session.export(root / "final")
    return losses, root / "final"


def run_steps(session: TrialSession, steps: int) -> list[float]:
    """Run units until `steps` more steps completed their backward; their losses."""
    losses: list[float] = []
    while len(losses) < steps:
        result = session.run_unit()
        if result.loss is not None:
            losses.append(result.loss)
    return losses


def test_a_wiped_store_resumes_from_its_checkpoint_with_the_uninterrupted_numbers(
    tokens_path: Path, tmp_path: Path, uninterrupted: tuple[list[float], Path]
) -> None:
    spill, disk = tmp_path / "spill", tmp_path / "checkpoints"
    trial_create(spec=tiny_spec(tokens_path), spill_dir=spill, trial_id="t", device=CPU, cuts=CUTS)
    session = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    run_steps(session, 7)
    session.run_unit()  # mid-step: the checkpoint holds a step in flight, its RNG and running sums
    info = checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="t")
    assert info is not None and info.step == 7 and info.cursor == session.cursor
    run_steps(session, 3)  # work the reboot loses
    session.close()
    shutil.rmtree(spill)  # the reboot

    restored = restore_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, trial_id="t")
    assert restored == info
    again = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    assert again.cursor == info.cursor
    losses = [r.loss for r in run_all(again) if r.loss is not None]
    again.export(tmp_path / "final")
    assert losses == uninterrupted[0][7:]
    for name, tensor in weights(uninterrupted[1]).items():
        assert torch.equal(weights(tmp_path / "final")[name], tensor), name


def test_a_snapshot_holds_its_commit_while_training_goes_on(tokens_path: Path, tmp_path: Path) -> None:
    spill, disk = tmp_path / "spill", tmp_path / "checkpoints"
    trial_create(spec=tiny_spec(tokens_path), spill_dir=spill, trial_id="t", device=CPU, cuts=CUTS)
    session = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    run_steps(session, 2)
    held = snapshot(spill_dir=spill, checkpoint_dir=disk, trial_id="t")
    assert held is not None
    snapped = {name: (spill / "t" / name).read_bytes() for name in os.listdir(spill / "t") if name.endswith(".bin")}
    cursor = session.cursor
    assert snapshot(spill_dir=spill, checkpoint_dir=disk, trial_id="t") is None  # one checkpoint at a time
    run_steps(session, 2)  # supersedes (deletes from the store) every parameter file the snapshot holds
    assert not set(snapped) & set(os.listdir(spill / "t"))
    info = held.write()
    assert info.cursor == cursor and info.step == 2
    assert not (spill / SNAPSHOTS / "t").exists()  # the links are gone once copied
    for name, data in snapped.items():
        assert (info.path / name).read_bytes() == data, name
    # The trial's commit moved on: a new snapshot is taken; at the same commit there is nothing to take.
    assert checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="t") is not None
    assert checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="t") is None
    assert [n for n in os.listdir(disk / "t") if n.startswith("ckpt-")] == [latest(disk, "t").path.name]


def test_a_checkpoint_cut_off_half_way_is_never_restored(tokens_path: Path, tmp_path: Path) -> None:
    spill, disk = tmp_path / "spill", tmp_path / "checkpoints"
    trial_create(spec=tiny_spec(tokens_path), spill_dir=spill, trial_id="t", device=CPU, cuts=CUTS)
    session = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    run_steps(session, 1)
    first = checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="t")
    assert first is not None
    run_steps(session, 1)
    held = snapshot(spill_dir=spill, checkpoint_dir=disk, trial_id="t")
    assert held is not None
    os.unlink(held.links / sorted(os.listdir(held.links))[3])  # the copy dies after its first files
    with pytest.raises(FileNotFoundError):
        held.write()
    assert any(n.startswith(".partial-") for n in os.listdir(disk / "t"))
    assert latest(disk, "t") == first
    with pytest.raises(SpillStoreError, match="has a spill store"):
        restore_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, trial_id="t")
    session.close()
    shutil.rmtree(spill)
    assert restore_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, trial_id="t") == first
    assert TrialSession.open(spill_dir=spill, trial_id="t", device=CPU).cursor == first.cursor
    assert json.loads((first.path / "checkpoint.json").read_text())["step"] == 1
    # A checkpoint of the restored store (its commits numbered anew) removes what the cut-off one left.
    again = checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="t")
    assert again is not None and again.cursor == first.cursor and again.version > held.version
    assert not any(n.startswith(".partial-") for n in os.listdir(disk / "t"))


def test_a_trial_without_a_checkpoint_restores_nothing(tmp_path: Path) -> None:
    assert restore_from_checkpoint(checkpoint_dir=tmp_path / "c", spill_dir=tmp_path / "s", trial_id="t") is None
    assert not (tmp_path / "s" / "t").exists()


def test_links_a_killed_writer_left_are_freed_but_not_those_being_written(tokens_path: Path, tmp_path: Path) -> None:
    spill, disk = tmp_path / "spill", tmp_path / "checkpoints"
    for trial_id in ("a", "b"):
        trial_create(spec=tiny_spec(tokens_path), spill_dir=spill, trial_id=trial_id, device=CPU, cuts=CUTS)
    writing = snapshot(spill_dir=spill, checkpoint_dir=disk, trial_id="a")
    assert writing is not None
    (spill / SNAPSHOTS / "b").mkdir()  # what a writer of b killed mid-copy left: links, and its lock free
    (spill / SNAPSHOTS / "b" / "p0@1.bin").write_bytes(b"held")
    assert sweep_snapshots(spill_dir=spill, checkpoint_dir=disk) == ["b"]
    assert sorted(os.listdir(spill / SNAPSHOTS)) == ["a"]
    assert writing.write().step == 0  # the links being written were left alone
