"""The commit protocol: staged buffers are invisible until commit; a crash leaves the last commit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker.engine.errors import SpillStoreError
from worker.engine.spill_pool import POOL
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


MIB = 1 << 18  # fp32 values in 1 MiB: a buffer large enough to be pooled (POOL_MIN_BYTES)


def pooled(root: Path) -> list[Path]:
    return sorted(root.glob(f"{POOL}*"))


def test_a_superseded_large_buffer_is_written_over_by_the_next_version_of_its_size(tmp_path: Path) -> None:
    """Writing over the file a commit superseded spares the kernel allocating (and later freeing) every page
    of a new one; what is read back is the new version, and the store holds one superseded file at most."""
    root = tmp_path / "t"
    store = SpillStore.create(root, {})
    for value in range(2):
        store.write("g0", torch.full((MIB,), float(value)))
        store.commit()
    (kept,) = pooled(root)
    inode = kept.stat().st_ino
    store.write("g0", torch.full((MIB,), 2.0))
    assert store.path("g0").stat().st_ino == inode and not pooled(root)  # the same pages, now the staged version
    store.commit()
    assert torch.equal(SpillStore.open(root).read_new("g0", MIB, torch.float32), torch.full((MIB,), 2.0))
    assert [p.name for p in root.glob("*.bin")] == ["g0@3.bin"] and len(pooled(root)) == 1

    # A writer that dies while writing over a pooled file leaves an orphan, as one writing a new file does.
    store.manifest["cursor"] = 1
    with pytest.raises(RuntimeError), store.writer("g0", nbytes=MIB * 4) as append:
        append(torch.full((MIB // 2,), 9.0))
        raise RuntimeError("killed")
    reopened = SpillStore.take(root, 1)
    assert [p.name for p in root.glob("*.bin")] == ["g0@3.bin"] and "cursor" not in reopened.manifest
    assert torch.equal(reopened.read_new("g0", MIB, torch.float32), torch.full((MIB,), 2.0))


def test_the_pool_holds_what_one_commit_superseded_and_goes_before_a_new_file(tmp_path: Path) -> None:
    root = tmp_path / "t"
    store = SpillStore.create(root, {})
    store.write("a", torch.zeros(MIB))
    store.write("b", torch.zeros(2 * MIB))
    store.commit()
    store.write("a", torch.ones(MIB))
    store.commit()
    store.write("b", torch.ones(2 * MIB))
    store.commit()  # the pool now holds b's old file only: a's went at this commit
    assert [p.stat().st_size for p in pooled(root)] == [8 * MIB]
    store.write("c", torch.ones(3 * MIB))  # no pooled file of its size: the pool goes before a new file is made
    assert not pooled(root)
    store.commit()
    store.write("d", torch.ones(4))  # a small buffer is never pooled, and leaves the pool alone
    store.commit()
    assert sorted(p.name for p in root.glob("*.bin")) == ["a@2.bin", "b@3.bin", "c@4.bin", "d@5.bin"]
    assert not pooled(root)


def test_a_superseded_file_that_a_snapshot_links_is_never_written_over(tmp_path: Path) -> None:
    root = tmp_path / "t"
    store = SpillStore.create(root, {})
    store.write("p0", torch.ones(MIB))
    store.commit()
    SpillStore.link_committed(root, tmp_path / "snapshot")
    for value in (2.0, 3.0, 4.0):
        store.write("p0", torch.full((MIB,), value))
        store.commit()
    assert torch.equal(SpillStore.open(tmp_path / "snapshot").read_new("p0", MIB, torch.float32), torch.ones(MIB))
    assert torch.equal(SpillStore.open(root).read_new("p0", MIB, torch.float32), torch.full((MIB,), 4.0))


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
