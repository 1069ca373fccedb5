"""Fencing: a writer that lost the trial to a newer token (a slow worker past its lease) cannot write it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.conftest import CPU, run_all, tiny_spec
from worker.engine import StaleWriterError, TrialSession, trial_create
from worker.engine.spill_store import SpillStore

CUTS = [0, 2, 4]
PHASE_METHODS = {"F": "_forward", "FB": "_forward_backward", "B": "_backward", "E": "_evaluate", "S": "_final_step"}


def weights(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


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


def test_a_slow_writer_past_its_lease_leaves_the_store_untouched(tokens_path: Path, tmp_path: Path) -> None:
    """Two writers of one trial: the slow one stalls mid-unit (its outputs staged, not committed) while the
    new lease holder re-runs that unit and more; the slow one's commit is then refused, the store is
    byte-for-byte what the new holder left, and training ends exactly as an uninterrupted run."""
    spec = tiny_spec(tokens_path, steps=3)
    trial_create(spec=spec, spill_dir=tmp_path / "plain", trial_id="t", device=CPU, cuts=CUTS)
    plain = TrialSession.open(spill_dir=tmp_path / "plain", trial_id="t", device=CPU)
    run_all(plain)
    plain.export(tmp_path / "plain-export")

    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=CUTS)
    slow = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    fast = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    for token in range(1, 4):
        slow.run_unit(token=token)
    staged, release = threading.Event(), threading.Event()
    unit = slow.next_unit()
    assert unit is not None
    name = PHASE_METHODS[unit.phase]
    original = getattr(slow, name)

    def stall(unit_spec: object) -> object:
        metrics = original(unit_spec)
        staged.set()
        release.wait()
        return metrics

    setattr(slow, name, stall)
    errors: list[BaseException] = []

    def run_slow() -> None:
        try:
            slow.run_unit(token=4)
        except BaseException as error:  # handed to the test thread, which checks it
            errors.append(error)

    thread = threading.Thread(target=run_slow)
    thread.start()
    assert staged.wait(30)
    for token in range(5, 9):  # the new lease holder re-runs the stalled unit, then goes on
        fast.run_unit(token=token)
    before = snapshot(tmp_path / "t")
    release.set()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], StaleWriterError), errors
    assert snapshot(tmp_path / "t") == before

    token = 9
    while fast.next_unit() is not None:
        fast.run_unit(token=token)
        token += 1
    fast.export(tmp_path / "export")
    expected = weights(tmp_path / "plain-export")
    actual = weights(tmp_path / "export")
    assert actual.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(actual[key], tensor), key
