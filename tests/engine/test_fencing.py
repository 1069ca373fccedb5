"""Fencing: a writer that lost the trial to a newer token (a slow worker past its lease) cannot write it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.conftest import CPU, run_all, tiny_spec
from worker.engine import StaleWriterError, TrialSession, spill_store, trial_create
from worker.engine.faults import REACHED, RELEASE, Fault
from worker.engine.spill_store import SpillStore

CUTS = [0, 2, 4]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def live(store: SpillStore) -> list[str]:
    """The files a store's manifest refers to."""
    return [store.path(name).name for name in store.buffers]


def unreferenced(trial_dir: Path) -> set[str]:
    """Buffer files on disk that the committed manifest does not refer to."""
    return {p.name for p in trial_dir.glob("*.bin")} - set(live(SpillStore.open(trial_dir)))


def test_a_newer_token_takes_the_store_and_an_older_one_is_refused(tmp_path: Path) -> None:
    store = SpillStore.create(tmp_path / "t", {"cursor": 0})
    store.write("p0", torch.zeros(4))
    store.commit()
    stale = SpillStore.take(tmp_path / "t", 5)
    stale.write("p0", torch.ones(4))
    SpillStore.take(tmp_path / "t", 6)  # removes what token 5 staged
    with pytest.raises(StaleWriterError, match="version"):
        stale.commit()
    with pytest.raises(StaleWriterError, match="taken with token 6"):
        SpillStore.take(tmp_path / "t", 5)
    assert SpillStore.open(tmp_path / "t").read_new("p0", 4, torch.float32).tolist() == [0, 0, 0, 0]
    assert sorted(p.name for p in (tmp_path / "t").glob("*.bin")) == ["p0@1.bin"]


@pytest.mark.parametrize("point", ["before-write", "mid-step", "mid-write", "before-commit"])
def test_a_writer_stalled_before_during_or_after_writing_cannot_commit_and_leaves_nothing(
    point: str, tokens_path: Path, tmp_path: Path
) -> None:
    """The stale writer stalls at `point` of unit 10 (F0 of step 1: it updates shard 0, then writes its
    forward's outputs) while a newer token re-runs that unit and more. Readers only ever see commits; the
    stale writer's commit is refused, what it staged is deleted, and training ends as an uninterrupted run."""
    spec = tiny_spec(tokens_path, steps=3)
    trial_create(spec=spec, spill_dir=tmp_path / "plain", trial_id="t", device=CPU, cuts=CUTS)
    plain = TrialSession.open(spill_dir=tmp_path / "plain", trial_id="t", device=CPU)
    run_all(plain)
    plain.export(tmp_path / "plain-export")

    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=CUTS)
    trial_dir = tmp_path / "t"
    slow = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    fast = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    for token in range(1, 11):
        slow.run_unit(token=token)
    slow.fault = Fault(point=point, unit=10, signal_dir=tmp_path / "fault")
    errors: list[BaseException] = []

    def run_slow() -> None:
        try:
            slow.run_unit(token=11)
        except BaseException as error:  # handed to the test thread, which checks it
            errors.append(error)

    thread = threading.Thread(target=run_slow)
    thread.start()
    deadline = time.monotonic() + 60
    while not (tmp_path / "fault" / REACHED).exists():
        assert thread.is_alive() and time.monotonic() < deadline, errors
        time.sleep(0.01)
    stale = unreferenced(trial_dir)
    assert bool(stale) == (point in ("mid-step", "mid-write", "before-commit")), stale  # files it staged so far
    reader = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    assert reader.cursor == 10 and not stale & set(live(reader.store))

    for token in range(12, 16):  # the new holder re-runs unit 10, then goes on
        fast.run_unit(token=token)
    assert not unreferenced(trial_dir)  # taking the trial removed what the stale writer had staged
    before = snapshot(trial_dir)
    (tmp_path / "fault" / RELEASE).touch()
    thread.join(60)
    assert len(errors) == 1 and isinstance(errors[0], StaleWriterError), errors
    assert snapshot(trial_dir) == before  # whatever it wrote after the takeover it deleted again
    assert TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU).cursor == 14

    token = 16
    while fast.next_unit() is not None:
        fast.run_unit(token=token)
        token += 1
    fast.export(tmp_path / "export")
    expected = weights(tmp_path / "plain-export")
    actual = weights(tmp_path / "export")
    assert actual.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(actual[key], tensor), key


def test_a_stale_writer_and_the_new_one_may_both_remove_its_files_at_once(tmp_path: Path, monkeypatch) -> None:
    """The stale writer drops its staged files while the new writer's take removes them as orphans: whichever
    unlinks a file second finds it gone, and neither fails for it (a stale unit is dropped, never a failed
    trial)."""
    store = SpillStore.create(tmp_path / "t", {"cursor": 0})
    store.write("p0", torch.zeros(4))
    store.commit()
    stale = SpillStore.take(tmp_path / "t", 5)
    stale.write("p0", torch.ones(4))
    stale.write("g0", torch.ones(4))
    real_unlink = spill_store.os.unlink

    def raced(path: str) -> None:  # the other writer's cleanup got there first
        real_unlink(path)
        real_unlink(path)

    monkeypatch.setattr(spill_store.os, "unlink", raced)
    SpillStore.take(tmp_path / "t", 6)
    stale.remove_own_files()
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "t").glob("*.bin")) == ["p0@1.bin"]
    with pytest.raises(StaleWriterError):
        stale.commit()
