"""The spill store: one trial's whole training state as files under ``spill_dir/trial_id``.

Every buffer is a raw little-endian file ``<name>@<version>.bin``; ``manifest.json`` names the version of
each buffer plus all small state (cursor, per-shard flags, running sums). A unit writes *new* versions and
then commits by atomically replacing the manifest, so a process killed at any point leaves the previous
commit intact; files of an uncommitted unit are orphans, removed by the next writer (:meth:`SpillStore.remove_orphans`).
Safe against process death (what the scheduler's lease recovers from), not against power loss: nothing
is fsynced, and the host tier (``/dev/shm``) does not survive a reboot anyway.

Only one unit of a trial runs at a time (the scheduler's invariant), so there is a single writer.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from worker.engine.errors import SpillStoreError

MANIFEST = "manifest.json"
FORMAT = "hydra-spill/1"


def _file(root: Path, name: str, version: int) -> Path:
    return root / f"{name}@{version}.bin"


def read_file(path: Path, out: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
    """Fill the contiguous CPU tensor ``out`` with the bytes of ``path`` from byte ``offset``."""
    view = out.view(torch.uint8).numpy()
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        if f.readinto(view) != view.nbytes:
            raise SpillStoreError(f"{path} is shorter than {offset + view.nbytes} bytes")
    return out


class SpillStore:
    """Versioned flat buffers plus a JSON manifest; see the module docstring for the commit protocol.

    ``manifest`` is the working copy: edit it during a unit, then :meth:`commit`. :meth:`write` stages a
    buffer under the next version; :meth:`read` sees staged buffers first, then committed ones.
    """

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.manifest = manifest
        self._committed_files: dict[str, int] = dict(manifest["files"])
        self.bytes_read = 0
        self.bytes_written = 0

    @classmethod
    def create(cls, root: Path, manifest: dict[str, Any]) -> SpillStore:
        """Start a new store in the empty (or absent) directory ``root``; commit with :meth:`commit`."""
        if (root / MANIFEST).exists():
            raise SpillStoreError(f"{root} already holds a trial; pick another trial id or delete it")
        root.mkdir(parents=True, exist_ok=True)
        return cls(root, {"format": FORMAT, "version": 0, "files": {}} | manifest)

    @classmethod
    def open(cls, root: Path) -> SpillStore:
        """Open the last committed state of ``root`` (read-only until the caller writes and commits)."""
        try:
            manifest = json.loads((root / MANIFEST).read_text())
        except FileNotFoundError:
            raise SpillStoreError(f"no trial in {root}: {MANIFEST} is missing") from None
        if manifest.get("format") != FORMAT:
            raise SpillStoreError(f"{root / MANIFEST} has format {manifest.get('format')!r}, expected {FORMAT!r}")
        return cls(root, manifest)

    def remove_orphans(self) -> None:
        """Delete files no commit refers to: what a unit killed before its commit left behind.

        Only the writer may call this (another process may be staging a unit's files right now).
        """
        live = {f"{name}@{version}.bin" for name, version in self._committed_files.items()}
        with os.scandir(self.root) as entries:  # every unit calls this: no pathlib objects per file
            orphans = [e.path for e in entries if e.name.endswith(".bin") and e.name not in live]
        for path in orphans:
            os.unlink(path)

    @property
    def _next_version(self) -> int:
        return int(self.manifest["version"]) + 1

    def path(self, name: str) -> Path:
        try:
            return _file(self.root, name, self.manifest["files"][name])
        except KeyError:
            raise SpillStoreError(f"buffer {name!r} is not in the store at {self.root}") from None

    def version(self, name: str) -> int | None:
        return self.manifest["files"].get(name)

    def read(self, name: str, out: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
        """Fill the contiguous CPU tensor ``out`` from buffer ``name`` starting at byte ``offset``."""
        read_file(self.path(name), out, offset=offset)
        self.bytes_read += out.nbytes
        return out

    def read_new(self, name: str, numel: int, dtype: torch.dtype, *, offset: int = 0) -> torch.Tensor:
        return self.read(name, torch.empty(numel, dtype=dtype), offset=offset)

    def write(self, name: str, *parts: torch.Tensor) -> None:
        """Stage the concatenated raw bytes of ``parts`` (any device) as the next version of ``name``."""
        self.write_stream(name, parts)

    def write_stream(self, name: str, parts: Iterable[torch.Tensor]) -> None:
        """Like :meth:`write`, consuming ``parts`` one at a time (so only one part need exist at once)."""
        with self.writer(name) as append:
            for part in parts:
                append(part)

    @contextlib.contextmanager
    def writer(self, name: str) -> Iterator[Callable[[torch.Tensor], None]]:
        """Stage the next version of ``name`` from tensors appended one by one; staged only on success."""
        version = self._next_version
        with open(_file(self.root, name, version), "wb") as f:

            def append(part: torch.Tensor) -> None:
                data = part.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy()
                f.write(data.data)
                self.bytes_written += data.nbytes

            yield append
        self.manifest["files"][name] = version

    def commit(self) -> None:
        """Atomically publish the working manifest and every staged buffer, then drop superseded files."""
        self.manifest["version"] = self._next_version
        tmp = self.root / f"{MANIFEST}.tmp"
        tmp.write_text(json.dumps(self.manifest))
        os.replace(tmp, self.root / MANIFEST)
        for name, version in self._committed_files.items():
            if self.manifest["files"].get(name) != version:
                _file(self.root, name, version).unlink(missing_ok=True)
        self._committed_files = dict(self.manifest["files"])
