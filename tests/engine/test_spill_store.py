"""The commit protocol: staged buffers are invisible until commit; a crash leaves the last commit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker.engine.errors import SpillStoreError
from worker.engine.spill_store import SpillStore


def test_it_reads_back_what_was_committed(tmp_path: Path) -> None:
    store = SpillStore.create(tmp_path / "t", {"cursor": 0})
    store.write("p0", torch.arange(6, dtype=torch.float32), torch.tensor([7.0]))
    store.commit()
    reopened = SpillStore.open(tmp_path / "t")
    assert reopened.read_new("p0", 7, torch.float32).tolist() == [0, 1, 2, 3, 4, 5, 7]
    assert reopened.read_new("p0", 2, torch.float32, offset=4 * 4).tolist() == [4, 5]


def test_a_buffer_of_zeros_is_staged_unwritten_and_reads_back_as_zeros(tmp_path: Path) -> None:
    store = SpillStore.create(tmp_path / "t", {"cursor": 0})
    store.write_zeros("m0", 6 * 4)
    assert store.bytes_written == 0 and "m0" in store.staged()
    store.commit()
    reopened = SpillStore.open(tmp_path / "t")
    assert torch.equal(reopened.read_new("m0", 6, torch.float32), torch.zeros(6))
    assert reopened.read_new("m0", 2, torch.float32, offset=4 * 4).tolist() == [0, 0]


def test_it_forgets_an_uncommitted_unit(tmp_path: Path) -> None:
    store = SpillStore.create(tmp_path / "t", {"cursor": 0})
    store.write("p0", torch.zeros(4))
    store.commit()
    store.manifest["cursor"] = 1
    store.write("p0", torch.ones(4))  # the process dies before commit()
    assert sorted(p.name for p in (tmp_path / "t").glob("*.bin")) == ["p0@1.bin", "p0@2.bin"]

    reopened = SpillStore.open(tmp_path / "t")
    assert reopened.manifest["cursor"] == 0
    assert reopened.read_new("p0", 4, torch.float32).tolist() == [0, 0, 0, 0]
    reopened.remove_orphans()
    assert [p.name for p in (tmp_path / "t").glob("*.bin")] == ["p0@1.bin"]


def test_it_drops_superseded_versions_on_commit(tmp_path: Path) -> None:
    store = SpillStore.create(tmp_path / "t", {})
    for value in range(3):
        store.write("g0", torch.full((2,), float(value)))
        store.commit()
    assert [p.name for p in (tmp_path / "t").glob("*.bin")] == ["g0@3.bin"]


def test_it_refuses_to_overwrite_a_trial(tmp_path: Path) -> None:
    SpillStore.create(tmp_path / "t", {}).commit()
    with pytest.raises(SpillStoreError, match="already holds a trial"):
        SpillStore.create(tmp_path / "t", {})
    with pytest.raises(SpillStoreError, match="missing"):
        SpillStore.open(tmp_path / "absent")


def test_it_tells_whether_a_commit_landed_since_it_looked(tmp_path: Path) -> None:
    store = SpillStore.create(tmp_path / "t", {"cursor": 0})
    store.commit()
    assert store.is_current()  # its own commit
    other = SpillStore.open(tmp_path / "t")
    assert other.is_current()
    for cursor in (1, 2):  # commits right after one another, within the file system's clock tick
        other.manifest["cursor"] = cursor
        other.commit()
        assert not store.is_current() and other.is_current()
        store = SpillStore.open(tmp_path / "t")
        assert store.is_current() and store.manifest["cursor"] == cursor
    taken = SpillStore.take(tmp_path / "t", token=3)  # taking is a commit too
    assert taken.is_current() and not store.is_current()
    (tmp_path / "t" / "manifest.json").unlink()
    assert not taken.is_current()
