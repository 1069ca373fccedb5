"""The spill store's pool: superseded buffer files kept to be written over rather than created anew.

A commit does not delete the large files it supersedes: it keeps them in the trial's pool
(``pool-<writer>-<bytes>-<name>@<version>.free`` in the store's directory, where ``<writer>`` is ``l<lane>`` for a
lane's writer, ``w`` for the whole trial's and ``s`` for a unit that applies a step's update alone, see
:func:`writer_tag`), and the next buffer of the same size, of any writer, is written
over one of them instead of into a new file. On a tmpfs of 4 KiB pages a new file costs the kernel an allocation
of each of its pages and a free of each at the commit that supersedes it: a new 64 MB buffer costs about three
times what writing over an old one does (``benchmarks/spill_tier.py``).

Bounded: a writer's share of the pool never holds more than its last commit superseded (each commit deletes what
is left of its writer's share first, :func:`retire_all`), and a writer that finds no file of its buffer's size
deletes its share before it creates a new file (:func:`claim`). So the store never holds more than the committed
buffers, and for each writer either the new versions of the unit it is writing or, between its units, the files
its last unit replaced: what it holds without a pool while every writer is in the middle of a unit.

Safe: a superseded file that a checkpoint's snapshot links (``SpillStore.link_committed``) is deleted, never
reused: its bytes are the snapshot's. A file claimed from the pool is the claiming writer's staged file, an orphan
like any other until its commit. A committed file is never written to, but a reader that opened a version before
a commit superseded it may see that file written over. Only two readers can: a background prefetch, whose read is
keyed by the version it read and then never used (:class:`worker.engine.transfer.Transfers`), and a stale writer
(one whose lease a newer writer took), whose commit is refused. The order of a wavefront's units keeps any unit
from reading a buffer that another unit running at the same time supersedes.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

POOL = "pool-"  # the name of every pooled file starts so; store files end in .bin, so orphan sweeps skip these
POOL_MIN_BYTES = 1 << 20  # smaller files cost little to create, and are not pooled


def writer_tag(lane: int | None, *, update: bool = False) -> str:
    """The share of the pool that a writer of ``lane`` (None: the whole trial) keeps; with ``update``, the share
    of the units that apply a step's update alone (``S``), whatever their lane.

    A one-shard step's ``S`` unit writes the weights and both optimizer moments anew while the step's parked
    gradients are still committed, so it needs three files of the model's size that the step's other units do not
    hold; its commit then supersedes the parked gradients and the old weights and moments, which the next step's
    micro-batches claim for their gradients. Were it lane 0's, lane 0's first commit of the next step would delete
    what is left of them, and every ``S`` unit would write three new files."""
    if update:
        return "s"
    return "w" if lane is None else f"l{lane}"


def claim(root: Path, path: Path, nbytes: int | None, writer: str) -> bool:
    """Before ``writer`` creates ``path``, a new file of ``nbytes`` bytes (None: not known), in the store at
    ``root``: move a pooled file of exactly that size to ``path`` and return True (the caller writes over it and
    cuts it to what it wrote); else delete ``writer``'s share first when the file is large (a new file takes new
    memory) and return False. Another writer may claim the same file at once: the rename is atomic, and the loser
    tries the next."""
    if nbytes is not None and nbytes < POOL_MIN_BYTES:
        return False
    pooled = _pooled(root)
    if nbytes is not None:
        for file in (file for file, _, size in pooled if size == str(nbytes)):
            try:
                os.rename(file, path)
            except FileNotFoundError:
                continue
            return True
    unlink_all([file for file, owner, _ in pooled if owner == writer])
    return False


def retire_all(root: Path, superseded: list[Path], writer: str) -> None:
    """The files a commit of ``writer`` superseded: each joins ``writer``'s share, which first lets go of what it
    held, if it is large and no snapshot links it; else it is deleted. The caller holds the manifest lock, under
    which snapshots link files too."""
    if not superseded:
        return
    unlink_all([file for file, owner, _ in _pooled(root) if owner == writer])
    for path in superseded:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        with contextlib.suppress(FileNotFoundError):
            if st.st_nlink == 1 and st.st_size >= POOL_MIN_BYTES:
                os.rename(path, path.with_name(f"{POOL}{writer}-{st.st_size}-{path.stem}.free"))
            else:
                os.unlink(path)


def unlink_all(paths: list[str]) -> None:
    """Delete files that no commit refers to. One may already be gone: a stale writer dropping its own files
    and the new writer removing orphans (``SpillStore.take``) can list the same file at once, and the
    second unlink must not fail the unit that only cleans up."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _pooled(root: Path) -> list[tuple[str, str, str]]:
    """The pooled files of the store at ``root``, each as (path, its writer's share, its size in bytes), read
    from their names in one scan of the directory."""
    with os.scandir(root) as entries:
        names = [(e.path, e.name.split("-", 3)) for e in entries if e.name.startswith(POOL)]
    return [(path, parts[1], parts[2]) for path, parts in names if len(parts) == 4]
