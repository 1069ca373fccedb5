"""The spill store: one trial's whole training state as files under ``spill_dir/trial_id``.

Every buffer is a raw little-endian file ``<name>@<version>.bin``; ``manifest.json`` names the version of
each buffer plus all small state (cursor, per-shard flags, running sums). A unit writes *new* versions and
then commits by atomically replacing the manifest, so a process killed at any point leaves the previous
commit intact; files of an uncommitted unit are orphans, removed by the next writer (:meth:`SpillStore.remove_orphans`).
Safe against process death (what the scheduler's lease recovers from), not against power loss: nothing
is fsynced, and the host tier (``/dev/shm``) does not survive a reboot anyway.

A commit keeps the large files it supersedes for the next buffers of their size to be written over, rather than
deleting them (:mod:`worker.engine.spill_pool`).

One writer per *lane* at a time, enforced by the store itself (fencing): the scheduler's lease makes one
device the writer of a trial's unit, but a device that was only slow past its lease may still be running the
unit that another device has re-run since. So a writer first takes the store (:meth:`SpillStore.take`) with
its fencing token (the lease's token: larger is newer), and :meth:`SpillStore.commit` is a compare-and-commit:
both run under an exclusive ``flock`` on ``manifest.lock`` and refuse with ``StaleWriterError`` when a newer
token took the trial (or the writer's lane) or another commit landed since the writer read the manifest.

A writer that takes the whole trial (no lane) is its one writer, as a unit of a trial that runs one unit at a
time is. A writer that takes a *lane* (a wavefront's micro-batch, see :class:`worker.engine.schedule.Segment`)
shares the trial with the writers of other lanes: its commit is refused only when a newer token took its own
lane or the whole trial, and a commit that finds another lane's commit landed since it read the manifest merges
onto it (its own buffers, and its changes to the trial keys through the caller's merge), refusing only a
conflict. Every writer stages its files under a *stage* of its own: the version of the commit that took the
store plus one (a version no commit names a file with), or, for a writer that did not take the store, the next
version. A lane's stage is kept in the manifest (``lanes``) while its writer may be staging, so that another
writer's sweep of orphans leaves its files alone; a stale writer's files are never referenced by a commit,
only removed as orphans.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import torch

from worker.engine import spill_pool
from worker.engine.errors import SpillStoreError, StaleWriterError

MANIFEST = "manifest.json"
LOCK = "manifest.lock"
FORMAT = "hydra-spill/1"
# The manifest keys the store itself reads and writes; every other key is its caller's (the trial state).
STORE_KEYS = frozenset({"format", "version", "files", "fence", "lanes"})


def _file(root: Path, name: str, version: int) -> Path:
    return root / f"{name}@{version}.bin"


def read_file(path: Path, out: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
    """Fill the contiguous CPU tensor ``out`` with the bytes of ``path`` from byte ``offset``.

    The file is read straight into the tensor's memory, through a buffer over its address rather than a NumPy
    view (which would pin the tensor's storage at its size: a unit frees a shard's weights early by emptying
    their storage, see ``ShardUnits._backward``)."""
    assert out.is_contiguous() and out.device.type == "cpu"
    nbytes = out.numel() * out.element_size()
    view = memoryview((ctypes.c_char * nbytes).from_address(out.data_ptr())).cast("B") if nbytes else b""
    done = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while done < nbytes:  # one read(2) returns at most about 2 GiB
            got = f.readinto(view[done:])
            if not got:
                raise SpillStoreError(f"{path} is shorter than {offset + nbytes} bytes")
            done += got
    return out


class SpillStore:
    """Versioned flat buffers plus a JSON manifest; see the module docstring for the commit protocol.

    ``manifest`` is the working copy: edit it during a unit, then :meth:`commit`. :meth:`write` stages a
    buffer under the next version; :meth:`read` sees staged buffers first, then committed ones.
    """

    def __init__(self, root: Path, manifest: dict[str, Any], stamp: tuple[int, int, int] | None = None, *,
                 lane: int | None = None) -> None:
        self.root = root
        self.manifest = manifest
        self._stamp = stamp  # (inode, mtime ns, size) of the manifest file this copy was read from or written as
        self._committed_files: dict[str, int] = dict(manifest["files"])
        self._base_version: int = manifest["version"]
        # What a lane's writer read, for merging onto later commits (set by take: only a lane's writer merges).
        self._base: dict[str, Any] = {}
        # The lane this writer took (None: the whole trial, or no take), and the stage its files carry.
        self.lane = lane
        self.pool_share = spill_pool.writer_tag(lane)  # the share of the pool it claims into and retires to
        lanes = manifest.get("lanes", {})
        self._stage: int = lanes[str(lane)]["stage"] if lane is not None else int(manifest["version"]) + 1
        self.bytes_read = 0
        self.bytes_written = 0
        self.io_s = 0.0  # seconds this writer spent reading, writing and committing buffers
        # Called with the number of buffers staged since the last commit, before each new buffer's file is
        # created (the session's fault points before-write and mid-write); None: nothing is called.
        self.before_stage: Callable[[int], None] | None = None

    @classmethod
    def create(cls, root: Path, manifest: dict[str, Any]) -> SpillStore:
        """Start a new store in the empty (or absent) directory ``root``; commit with :meth:`commit`."""
        if (root / MANIFEST).exists():
            raise SpillStoreError(f"{root} already holds a trial; pick another trial id or delete it")
        root.mkdir(parents=True, exist_ok=True)
        return cls(root, {"format": FORMAT, "version": 0, "files": {}} | manifest)

    @staticmethod
    def exists(root: Path) -> bool:
        """Whether ``root`` holds a committed store."""
        return (root / MANIFEST).exists()

    @classmethod
    def open(cls, root: Path) -> SpillStore:
        """Open the last committed state of ``root`` (read-only until the caller writes and commits)."""
        return cls(root, *_read_manifest_stamped(root))

    def is_current(self) -> bool:
        """Whether no commit landed since this store was opened or last committed here: one ``stat`` of the
        manifest (every commit replaces it with a new file), instead of reading and parsing it."""
        try:
            st = os.stat(self.root / MANIFEST)
        except FileNotFoundError:
            return False
        return self._stamp == (st.st_ino, st.st_mtime_ns, st.st_size)

    @classmethod
    def take(cls, root: Path, token: int, *, lane: int | None = None) -> SpillStore:
        """Become the trial's one writer with fencing ``token``, or with ``lane`` the writer of that lane; return
        the store as last committed.

        Under the manifest lock: refuse with ``StaleWriterError`` if a writer with a larger token took the
        trial (or the lane) already, else record ``token`` in a commit of its own (which makes every commit
        prepared by an earlier writer of the trial, or of the lane, fail) and remove what earlier writers
        staged but never committed (but what the other lanes' writers may be staging).
        """
        with _locked(root):
            manifest = _read_manifest(root)
            fence = manifest.get("fence", -1)
            if fence > token:
                raise StaleWriterError(f"writer with fencing token {token} refused: the trial in {root} was "
                                       f"taken with token {fence} since")
            if lane is None:
                store = cls(root, manifest | {"fence": token} | ({"lanes": {}} if manifest.get("lanes") else {}))
            else:
                lanes = dict(manifest.get("lanes", {}))
                held = lanes.get(str(lane))
                if held is not None and held["token"] > token:
                    raise StaleWriterError(f"writer with fencing token {token} refused: lane {lane} of the trial "
                                           f"in {root} was taken with token {held['token']} since")
                # The take's own commit is version + 1, which names no file: the writer stages after it. What the
                # lane's last writer committed stays known (see lane_committed).
                lanes[str(lane)] = {"token": token, "stage": int(manifest["version"]) + 2,
                                    **({"prev": {"token": held["token"], "unit": held["unit"]}}
                                       if held is not None and "unit" in held else {})}
                store = cls(root, manifest | {"lanes": lanes})
            store._publish()
            store.lane = lane
            store._stage = int(store.manifest["version"]) + 1  # = the lane's recorded stage
            if lane is not None:
                store._base = json.loads(json.dumps(store.manifest))
            store.remove_orphans()
        return store

    @property
    def token(self) -> int | None:
        """The fencing token this writer took the store with (None: it did not take it)."""
        if self.lane is not None:
            return int(self.manifest["lanes"][str(self.lane)]["token"])
        return None

    @staticmethod
    def link_committed(root: Path, dest: Path) -> dict[str, Any]:
        """Hard-link every file of the last commit of ``root`` into the new directory ``dest`` (on the same
        filesystem) and write its manifest there; return that manifest. Under the manifest lock, so no commit
        lands half-way; a commit never changes a file in place, so the links stay that commit's bytes for as
        long as they exist, whatever the trial does next, and cost no copy."""
        with _locked(root):
            manifest = _read_manifest(root)
            dest.mkdir(parents=True)
            for name, version in manifest["files"].items():
                os.link(_file(root, name, version), _file(dest, name, version))
            (dest / MANIFEST).write_text(json.dumps(manifest))
        return manifest

    def remove_orphans(self) -> None:
        """Delete files no commit refers to: what a unit killed (or refused) before its commit left behind.

        Only a writer may call this: the whole trial's (another process may be staging a unit's files right
        now), or a lane's, which leaves the files of the stages the other lanes' writers hold.
        """
        live = {f"{name}@{version}.bin" for name, version in self._committed_files.items()}
        staging = {f"@{held['stage']}.bin" for lane, held in self.manifest.get("lanes", {}).items()
                   if lane != str(self.lane)}
        with os.scandir(self.root) as entries:  # every unit calls this: no pathlib objects per file
            orphans = [e.path for e in entries if e.name.endswith(".bin") and e.name not in live
                       and not any(e.name.endswith(suffix) for suffix in staging)]
        spill_pool.unlink_all(orphans)


    def path(self, name: str) -> Path:
        try:
            return _file(self.root, name, self.manifest["files"][name])
        except KeyError:
            raise SpillStoreError(f"buffer {name!r} is not in the store at {self.root}") from None

    def version(self, name: str) -> int | None:
        return self.manifest["files"].get(name)

    @property
    def buffers(self) -> dict[str, int]:
        """Buffer name -> version, as of the working manifest (staged buffers included); do not edit it."""
        files: dict[str, int] = self.manifest["files"]
        return files

    @property
    def fence(self) -> int:
        """The fencing token of the trial's writer as of this working copy (-1: never taken)."""
        return int(self.manifest.get("fence", -1))

    @property
    def commit_version(self) -> int:
        """The version of the commit this working copy was read from or last committed as."""
        return int(self.manifest["version"])

    def drop(self, name: str) -> None:
        """Remove buffer ``name`` from the working manifest; the next commit deletes its file."""
        del self.manifest["files"][name]

    def read(self, name: str, out: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
        """Fill the contiguous CPU tensor ``out`` from buffer ``name`` starting at byte ``offset``."""
        start = time.perf_counter()
        read_file(self.path(name), out, offset=offset)
        self.io_s += time.perf_counter() - start
        self.bytes_read += out.nbytes
        return out

    def read_new(self, name: str, numel: int, dtype: torch.dtype, *, offset: int = 0) -> torch.Tensor:
        return self.read(name, torch.empty(numel, dtype=dtype), offset=offset)

    def write(self, name: str, *parts: torch.Tensor) -> None:
        """Stage the concatenated raw bytes of ``parts`` (any device) as the next version of ``name``."""
        self.write_stream(name, parts, nbytes=sum(part.nbytes for part in parts))

    def write_stream(self, name: str, parts: Iterable[torch.Tensor], *, nbytes: int | None = None) -> None:
        """Like :meth:`write`, consuming ``parts`` one at a time (so only one part need exist at once); ``nbytes``
        as in :meth:`writer`."""
        with self.writer(name, nbytes=nbytes) as append:
            for part in parts:
                append(part)

    def write_zeros(self, name: str, nbytes: int) -> None:
        """Stage ``nbytes`` zero bytes as the next version of ``name`` without writing them: a file extended to
        its size reads as zeros (a sparse file), so a buffer that starts at zero (a new trial's AdamW moments,
        as many bytes as its weights) costs neither the writes nor, on tmpfs, host memory until a unit stages
        its next version."""
        with self._staging(name) as f:
            f.truncate(nbytes)

    @contextlib.contextmanager
    def writer(self, name: str, *, nbytes: int | None = None) -> Iterator[Callable[[torch.Tensor], None]]:
        """Stage a new version of ``name`` (this writer's stage) from tensors appended one by one; staged only
        on success. ``nbytes``: how many bytes will be appended, when known, so that a pooled file of that size
        is written over (:mod:`worker.engine.spill_pool`); the file holds what was appended either way."""
        with self._staging(name, nbytes=nbytes, reuse=True) as f:

            def append(part: torch.Tensor) -> None:
                start = time.perf_counter()
                data = part.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy()
                f.write(data.data)
                self.io_s += time.perf_counter() - start
                self.bytes_written += data.nbytes

            yield append

    @contextlib.contextmanager
    def _staging(self, name: str, *, nbytes: int | None = None, reuse: bool = False) -> Iterator[BinaryIO]:
        """The file of a new version of ``name`` (this writer's stage), staged when the block ends without error.
        With ``reuse``, a file of ``nbytes`` bytes (None: not known) from the pool, if it has one
        (:func:`worker.engine.spill_pool.claim`), written over and cut to what was written."""
        version = self._stage
        assert version > 0, "a lane's writer takes its lane again before it stages another unit"
        if self.before_stage is not None:
            self.before_stage(len(self.staged()))
        path = _file(self.root, name, version)
        claimed = reuse and spill_pool.claim(self.root, path, nbytes, self.pool_share)
        with open(path, "r+b" if claimed else "wb") as f:
            yield f
            if claimed:
                f.truncate(f.tell())
        self.manifest["files"][name] = version

    def staged(self) -> dict[str, int]:
        """Buffer name -> version of every buffer staged since the last commit (written, not yet published)."""
        return {name: version for name, version in self.manifest["files"].items()
                if self._committed_files.get(name) != version}

    def remove_own_files(self) -> None:
        """Delete the files this writer created since its last commit, staged or cut off half-way, for a
        writer that will not commit (refused, or failed after a newer writer took the trial). They carry a
        version no other writer stages under (see the module docstring); any file the committed manifest
        refers to is kept all the same."""
        suffix = f"@{self._stage}.bin"
        live = {f"{name}@{version}.bin" for name, version in _read_manifest(self.root)["files"].items()}
        with os.scandir(self.root) as entries:
            mine = [e.path for e in entries if e.name.endswith(suffix) and e.name not in live]
        spill_pool.unlink_all(mine)

    def commit(self, merge: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None,
               *, unit: int | None = None) -> None:
        """Atomically publish the working manifest and every staged buffer, then drop superseded files.

        Compare-and-commit: raises ``StaleWriterError`` (and publishes nothing) if the store was committed
        or taken by another writer since this one read it, having deleted the files it staged (see
        :meth:`remove_own_files`); this store is then unusable (reopen it). A lane's writer (see :meth:`take`)
        whose lane and trial no newer token took merges onto the other lanes' commits instead: its buffers,
        where no other commit changed them, and the trial keys by ``merge(base, mine, theirs)`` (which raises a
        ``SpillStoreError`` for a conflict: refused as above). A lane's record keeps the ``unit`` its writer
        committed (see :meth:`lane_committed`).
        """
        start = time.perf_counter()
        with _locked(self.root):
            if self._base_version > 0:  # version 0: a store being created, not yet on disk
                on_disk = _read_manifest(self.root)
                if on_disk["version"] != self._base_version:
                    try:
                        self.manifest = self._merged(on_disk, merge)
                    except SpillStoreError as error:
                        self.remove_own_files()
                        raise StaleWriterError(
                            f"commit refused: the trial in {self.root} is at version {on_disk['version']}, this "
                            f"writer read version {self._base_version}; {error}") from None
                    self._committed_files = dict(self._base["files"])
            if self.lane is not None and unit is not None:
                lanes = self.manifest["lanes"]
                held = lanes[str(self.lane)]
                lanes[str(self.lane)] = {"token": held["token"], "stage": held["stage"], "unit": unit}
            self._publish()
        self.io_s += time.perf_counter() - start

    def lane_committed(self, lane: int, token: int) -> int | None:
        """The unit that the writer of ``lane`` with fencing ``token`` committed, if it did (None: it did not, or
        another writer took the lane since): a writer that died after its commit, before anyone heard of it."""
        held = self.manifest.get("lanes", {}).get(str(lane))
        for record in (held, (held or {}).get("prev")):
            if record is not None and record["token"] == token:
                return record.get("unit")
        return None

    def _merged(self, on_disk: dict[str, Any], merge: Callable[..., dict[str, Any]] | None) -> dict[str, Any]:
        """This writer's working manifest made onto ``on_disk``, a later commit; raises SpillStoreError saying
        why it cannot be (see :meth:`commit`)."""
        lane = self.lane
        if lane is None or merge is None:
            raise SpillStoreError("another writer took it or committed since")
        if on_disk.get("fence", -1) > self.manifest.get("fence", -1):
            raise SpillStoreError(f"the whole trial was taken with token {on_disk.get('fence')} since")
        held = on_disk.get("lanes", {}).get(str(lane))
        if held is None or held["token"] != self.token or held["stage"] != self._stage:
            raise SpillStoreError(f"lane {lane} was taken with token {held and held['token']} since")
        base_files, mine = self._base["files"], self.manifest["files"]
        files = dict(on_disk["files"])
        for name in {*base_files, *mine}:
            if mine.get(name) == base_files.get(name):
                continue
            if files.get(name) != base_files.get(name):
                raise SpillStoreError(f"buffer {name!r} was written by another commit since")
            if name in mine:
                files[name] = mine[name]
            else:
                files.pop(name, None)
        trial = merge({k: v for k, v in self._base.items() if k not in STORE_KEYS},
                      {k: v for k, v in self.manifest.items() if k not in STORE_KEYS},
                      {k: v for k, v in on_disk.items() if k not in STORE_KEYS})
        return {**trial, "format": FORMAT, "version": on_disk["version"], "files": files,
                "fence": on_disk.get("fence", -1), "lanes": on_disk.get("lanes", {})}

    def _publish(self) -> None:
        """Replace the manifest by the working one under the next version; the caller holds the lock."""
        self.manifest["version"] = int(self.manifest["version"]) + 1
        tmp = self.root / f"{MANIFEST}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(self.manifest))
            f.flush()
            st = os.fstat(f.fileno())
        os.replace(tmp, self.root / MANIFEST)
        self._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        spill_pool.retire_all(self.root, [_file(self.root, name, version)
                                          for name, version in self._committed_files.items()
                                          if self.manifest["files"].get(name) != version],
                              self.pool_share)
        self._committed_files = dict(self.manifest["files"])
        self._base_version = self.manifest["version"]
        # A whole trial's writer stages its next unit after this commit; a lane's writer takes its lane again
        # first (its stage is the one the other lanes' writers leave alone).
        self._stage = self._base_version + 1 if self.lane is None else -1


def _read_manifest(root: Path) -> dict[str, Any]:
    return _read_manifest_stamped(root)[0]


def _read_manifest_stamped(root: Path) -> tuple[dict[str, Any], tuple[int, int, int]]:
    """The manifest, and the (inode, mtime ns, size) of the very file it was read from."""
    try:
        with open(root / MANIFEST, "rb") as f:
            st = os.fstat(f.fileno())
            manifest: dict[str, Any] = json.loads(f.read())
    except FileNotFoundError:
        raise SpillStoreError(f"no trial in {root}: {MANIFEST} is missing") from None
    if manifest.get("format") != FORMAT:
        raise SpillStoreError(f"{root / MANIFEST} has format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest, (st.st_ino, st.st_mtime_ns, st.st_size)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold the trial's exclusive manifest lock (``flock``: released by the kernel if the process dies)."""
    try:
        lock = open(root / LOCK, "a")  # noqa: SIM115 -- closed below, after unlocking
    except FileNotFoundError:
        raise SpillStoreError(f"no trial in {root}: the directory is gone") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
