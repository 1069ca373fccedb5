"""Durable checkpoints: a trial's committed spill store copied to disk, crash-safe, one file at a time.

The spill store lives in host memory (``/dev/shm``), which a reboot wipes. A checkpoint is a copy of one of
its commits on disk (``<HYDRA_DATA_DIR>/checkpoints``), from which the trial's store can be rebuilt and the
trial resumed with the numbers it would have had (the store is the whole training state). Per trial::

    <trial>/ckpt-<version>/      a committed checkpoint: the buffer files of store commit <version>, the
                                 store's manifest.json, and checkpoint.json (step, time, sizes), written last
    <trial>/.partial-<version>/  a checkpoint being written: never read, removed by the trial's next one
    <trial>/checkpoint.lock      ``flock``-ed while a checkpoint of the trial is written (one at a time)

The rule: only a ``ckpt-*`` directory is ever restored, and a directory gets that name only by a rename
after every file in it, checkpoint.json last, was written and fsynced (the rename is fsynced in its parent
too), so a checkpoint cut off at any point, power loss included, is a ``.partial-*`` nothing reads. The
newer checkpoint is committed before the older one is deleted, so a trial always keeps one.

Taking a checkpoint has two halves. :func:`snapshot` is quick and runs between two units: under the store's
manifest lock it hard-links every file of the last commit into ``<spill_dir>/.snapshots/<trial>``
(:meth:`SpillStore.link_committed`). A commit never changes a file in place, it writes new versions and
deletes superseded ones, so the links keep that commit's bytes however far training goes meanwhile, and
linking copies nothing. :meth:`Snapshot.write` is slow and runs in any thread while training goes on: it
copies one file at a time in the kernel (no buffer in the process) and unlinks each link once its copy is
on disk, so the host memory the snapshot holds beyond the store is only what the trial superseded since the
snapshot and is not copied yet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from worker.engine.config import TrialSpec
from worker.engine.errors import SpecError, SpillStoreError
from worker.engine.spill_store import MANIFEST, SpillStore
from worker.engine.trial_state import TrialState

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.json"
COMMITTED = "ckpt-"
PARTIAL = ".partial-"
LOCK = "checkpoint.lock"
SNAPSHOTS = ".snapshots"  # in the spill directory, beside the trials' stores (hard links need one filesystem)
RESTORING = ".restoring-"


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    """A committed checkpoint: trial ``trial_id``'s store as of commit ``version``, taken at ``time`` (epoch
    seconds) after ``step`` completed optimizer steps; ``bytes`` on disk in ``path``."""

    trial_id: str
    version: int
    step: int
    cursor: int
    time: float
    bytes: int
    path: Path


def steps_done(manifest: dict[str, Any]) -> tuple[int, int]:
    """(optimizer steps whose backward completed, cursor) of the trial state in ``manifest``."""
    state = TrialState.from_manifest(manifest)
    timetable = state.timetable()
    if state.cursor >= len(timetable):  # finished (an early stop jumps here): every update it took is applied
        return max(shard.optim_steps for shard in state.shards), state.cursor
    unit = timetable[state.cursor]
    return unit.step + (unit.phase in ("E", "S")), state.cursor


def latest(checkpoint_dir: Path, trial_id: str) -> CheckpointInfo | None:
    """The trial's newest committed checkpoint, or None. One whose checkpoint.json cannot be read is
    skipped (logged) for the one before, if any."""
    root = Path(checkpoint_dir) / trial_id
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return None
    versions = sorted((int(n[len(COMMITTED):]) for n in names
                       if n.startswith(COMMITTED) and n[len(COMMITTED):].isdigit()), reverse=True)
    for version in versions:
        path = root / f"{COMMITTED}{version}"
        try:
            meta = json.loads((path / CHECKPOINT).read_text())
            return CheckpointInfo(trial_id=trial_id, version=int(meta["version"]), step=int(meta["step"]),
                                  cursor=int(meta["cursor"]), time=float(meta["time"]), bytes=int(meta["bytes"]),
                                  path=path)
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("checkpoint %s is unreadable and skipped: %s", path, error)
    return None


def delete_checkpoints(checkpoint_dir: Path, trial_id: str) -> None:
    """Delete every checkpoint of the trial (it is planned anew, or deleted)."""
    shutil.rmtree(Path(checkpoint_dir) / trial_id, ignore_errors=True)


class Snapshot:
    """A trial's commit held by hard links, and the trial's checkpoint lock, until :meth:`write` or :meth:`close`."""

    def __init__(self, *, trial_id: str, lock: IO[str], links: Path, trial_dir: Path, manifest: dict[str, Any],
                 taken: float) -> None:
        self.trial_id = trial_id
        self._lock = lock
        self.links = links
        self.trial_dir = trial_dir  # the trial's checkpoints
        self.manifest = manifest
        self.version = int(manifest["version"])
        self.time = taken
        self.step, self.cursor = steps_done(manifest)

    def write(self) -> CheckpointInfo:
        """Copy the snapshot to disk file by file and commit it as the trial's checkpoint (see the module
        docstring), delete its older checkpoints, then release the links and the lock."""
        try:
            partial = self.trial_dir / f"{PARTIAL}{self.version}"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            total = 0
            files = {f"{name}@{version}.bin" for name, version in self.manifest["files"].items()}
            sizes: dict[str, int] = {}
            for name in sorted(files):
                sizes[name] = _copy_durably(self.links / name, partial / name)
                total += sizes[name]
                os.unlink(self.links / name)
            _write_durably(partial / MANIFEST, json.dumps(self.manifest))
            meta = {"trial_id": self.trial_id, "version": self.version, "step": self.step, "cursor": self.cursor,
                    "time": self.time, "bytes": total, "sizes": sizes}
            _write_durably(partial / CHECKPOINT, json.dumps(meta))
            _fsync_dir(partial)
            final = self.trial_dir / f"{COMMITTED}{self.version}"
            os.rename(partial, final)
            _fsync_dir(self.trial_dir)
            for name in os.listdir(self.trial_dir):  # older checkpoints, and partial ones of killed writers
                if name != final.name and (name.startswith(COMMITTED) or name.startswith(PARTIAL)):
                    shutil.rmtree(self.trial_dir / name, ignore_errors=True)
            return CheckpointInfo(trial_id=self.trial_id, version=self.version, step=self.step, cursor=self.cursor,
                                  time=self.time, bytes=total, path=final)
        finally:
            self.close()

    def close(self) -> None:
        """Drop the links (and the host memory only they hold) and release the lock, writing nothing."""
        shutil.rmtree(self.links, ignore_errors=True)
        _remove_if_empty(self.links.parent)
        with contextlib.suppress(ValueError):  # closed already
            self._lock.close()  # closing the file releases its flock


def snapshot(*, spill_dir: Path, checkpoint_dir: Path, trial_id: str, wait: bool = False) -> Snapshot | None:
    """Hold the trial's last commit for a checkpoint; None when its newest checkpoint already holds that
    commit, or another checkpoint of the trial is being written right now (with ``wait``, that one is waited
    for instead: a trial's last checkpoint must not be skipped). Raises ``SpillStoreError`` when the trial has
    no store. Quick (one hard link per buffer), so it runs between two units."""
    store_root = Path(spill_dir) / trial_id
    if not SpillStore.exists(store_root):
        raise SpillStoreError(f"no trial in {store_root}: nothing to checkpoint")
    trial_dir = Path(checkpoint_dir) / trial_id
    trial_dir.mkdir(parents=True, exist_ok=True)
    lock = open(trial_dir / LOCK, "a")  # noqa: SIM115 -- the Snapshot closes it, which releases the lock
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        lock.close()
        return None
    try:
        newest = latest(checkpoint_dir, trial_id)
        if newest is not None and newest.version == SpillStore.open(store_root).commit_version:
            lock.close()
            return None
        links = Path(spill_dir) / SNAPSHOTS / trial_id
        shutil.rmtree(links, ignore_errors=True)  # what a snapshot of a killed process left (we hold the lock)
        taken = time.time()
        manifest = SpillStore.link_committed(store_root, links)
    except BaseException:
        lock.close()
        raise
    return Snapshot(trial_id=trial_id, lock=lock, links=links, trial_dir=trial_dir, manifest=manifest, taken=taken)


def sweep_snapshots(*, spill_dir: Path, checkpoint_dir: Path) -> list[str]:
    """Free the snapshot links no checkpoint is being written from (a process killed while writing one left
    them, holding host memory); return the trials whose links were freed. A snapshot is written only while
    its trial's lock is held, so links whose lock can be taken are abandoned."""
    try:
        trials = os.listdir(Path(spill_dir) / SNAPSHOTS)
    except FileNotFoundError:
        return []
    freed = []
    for trial_id in trials:
        lock_path = Path(checkpoint_dir) / trial_id / LOCK
        try:
            lock = open(lock_path, "a")  # noqa: SIM115 -- closed below
        except FileNotFoundError:  # its checkpoints were deleted: nobody writes one
            lock = None
        try:
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(Path(spill_dir) / SNAPSHOTS / trial_id, ignore_errors=True)
            freed.append(trial_id)
        except BlockingIOError:
            pass  # being written right now
        finally:
            if lock is not None:
                lock.close()
    _remove_if_empty(Path(spill_dir) / SNAPSHOTS)
    return freed


def _remove_if_empty(directory: Path) -> None:
    """Remove the snapshots' directory once no snapshot is in it, so that the spill directory holds nothing
    but stores (a snapshot being taken makes it again)."""
    with contextlib.suppress(OSError):
        os.rmdir(directory)


def checkpoint(*, spill_dir: Path, checkpoint_dir: Path, trial_id: str) -> CheckpointInfo | None:
    """Snapshot and write in one go (what a finished trial, or a test, does); None as :func:`snapshot`."""
    held = snapshot(spill_dir=spill_dir, checkpoint_dir=checkpoint_dir, trial_id=trial_id)
    return None if held is None else held.write()


def restore_from_checkpoint(*, checkpoint_dir: Path, spill_dir: Path, trial_id: str) -> CheckpointInfo | None:
    """Rebuild the trial's spill store from its newest checkpoint; None (nothing changed) when it has none.

    The store is assembled beside the others and renamed into place, so a restore cut off half-way leaves
    no store (and is simply done again). Its files are the checkpoint's, byte for byte; its next commits are
    numbered from the microseconds since the epoch, above any the lost store reached. Refuses with
    ``SpillStoreError`` when the trial has a store, or the checkpoint's files are not the sizes it recorded.
    """
    info = latest(checkpoint_dir, trial_id)
    if info is None:
        return None
    _restore(info, spill_dir=Path(spill_dir), trial_id=trial_id)
    return info


def continue_from_checkpoint(*, checkpoint_dir: Path, spill_dir: Path, source_id: str, trial_id: str,
                             spec: TrialSpec) -> CheckpointInfo:
    """Make trial ``trial_id``'s store from the last checkpoint of the ended trial ``source_id``, to train the
    segment ``spec`` adds to it (its last continuation): the same state, with ``spec`` as its spec and the
    cursor at the first unit of the added steps. ``source_id``'s checkpoint stays as it is.

    Refuses with ``SpecError`` when ``spec`` is not the source's spec with one segment added after the steps
    it trained, and with ``SpillStoreError`` when the source has no checkpoint or its checkpoint is not of
    its end (or as :func:`restore_from_checkpoint`)."""
    info = latest(checkpoint_dir, source_id)
    if info is None:
        raise SpillStoreError(f"trial {source_id} has no checkpoint to continue from")
    _restore(info, spill_dir=Path(spill_dir), trial_id=trial_id,
             edit=lambda manifest: _continued(manifest, source_id=source_id, trial_id=trial_id, spec=spec))
    return info


def _continued(manifest: dict[str, Any], *, source_id: str, trial_id: str, spec: TrialSpec) -> dict[str, Any]:
    """``manifest`` of the ended trial ``source_id`` as trial ``trial_id``'s, about to train ``spec``'s last
    segment."""
    state = TrialState.from_manifest(manifest)
    ended = state.spec
    if not spec.continuations:
        raise SpecError(f"trial {trial_id} continues trial {source_id} but adds no steps to it")
    added = spec.continuations[-1]
    # The spec the source trained: a device may have set its memory budget, which its plan was made for.
    if dataclasses.replace(spec, continuations=spec.continuations[:-1], budget_bytes=ended.budget_bytes) != ended:
        raise SpecError(f"trial {trial_id} is not trial {source_id} with steps added: their specs differ beyond the "
                        "added segment")
    before = state.timetable(spec=ended)
    updates = {shard.optim_steps for shard in state.shards}
    if state.cursor < len(before) or len(updates) != 1 or any(shard.pending for shard in state.shards):
        raise SpillStoreError(f"the last checkpoint of trial {source_id} is of unit {state.cursor} of its "
                              f"{len(before)}, not of its end: only an ended trial continues")
    (trained,) = updates  # an ended trial applied every step's update, however its timetable ended
    if added.after != trained:
        raise SpecError(f"trial {source_id} trained {trained} steps: the added steps start there, not after "
                        f"step {added.after}")
    state.spec = dataclasses.replace(spec, budget_bytes=ended.budget_bytes)
    state.trial_id = trial_id
    state.cursor = state.timetable().step_offset(trained)
    state.last_unit, state.last_metrics = -1, {}  # nothing of the new trial ran yet
    state.early_stop.since = 0  # a trial that stopped early gets its patience again for the added steps
    return {**manifest, **state.to_manifest()}


def _restore(info: CheckpointInfo, *, spill_dir: Path, trial_id: str,
             edit: Callable[[dict[str, Any]], dict[str, Any]] = lambda manifest: manifest) -> None:
    """Copy checkpoint ``info`` into trial ``trial_id``'s store, its manifest through ``edit``."""
    root = Path(spill_dir) / trial_id
    if SpillStore.exists(root):
        raise SpillStoreError(f"trial {trial_id} has a spill store in {root}; restoring would overwrite it")
    sizes: dict[str, int] = json.loads((info.path / CHECKPOINT).read_text())["sizes"]
    staging = Path(spill_dir) / f"{RESTORING}{trial_id}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for name, size in sizes.items():
            copied = shutil.copyfile(info.path / name, staging / name)
            if os.path.getsize(copied) != size:
                raise SpillStoreError(f"checkpoint {info.path}: {name} has {os.path.getsize(copied)} bytes, "
                                      f"its checkpoint.json says {size}")
        # Commits from here on use versions above every version the lost store used after the checkpoint, so
        # that no process that saw it can take a file of the new history for one of the same name it read.
        manifest = edit(json.loads((info.path / MANIFEST).read_text()))
        manifest["version"] = max(int(manifest["version"]), time.time_ns() // 1000)
        (staging / MANIFEST).write_text(json.dumps(manifest))
        shutil.rmtree(root, ignore_errors=True)  # a directory without a manifest is no store (e.g. its lock)
        os.rename(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _copy_durably(source: Path, dest: Path) -> int:
    """Copy ``source`` to the new file ``dest`` in the kernel (``sendfile``: no buffer in this process), fsync
    it, and return its size."""
    with open(source, "rb") as src, open(dest, "xb") as dst:
        size = os.fstat(src.fileno()).st_size
        sent = 0
        while sent < size:
            n = os.sendfile(dst.fileno(), src.fileno(), sent, size - sent)
            if n == 0:
                raise SpillStoreError(f"{source} ended after {sent} of its {size} bytes")
            sent += n
        os.fsync(dst.fileno())
    return size


def _write_durably(path: Path, text: str) -> None:
    with open(path, "x") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
