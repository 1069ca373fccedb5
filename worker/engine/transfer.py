"""Moving spill buffers onto the device: synchronous loads, and the copy-in half of the double buffer.

A :class:`Transfers` belongs to one ``TrialSession``. ``load`` reads a file range onto the device now;
``start`` reads one in the background, for ``take`` to pick up later. On CPU the background read is a
reader thread filling an ordinary tensor. On CUDA the reader thread also copies what it read to the device
on a copy stream of its own, so the compute stream neither runs nor waits for the copy until ``take``
makes it wait (on the device, through an event) for that one copy.

Host-to-device copies are asynchronous only from page-locked memory, so files stream to the device through
page-locked staging buffers, allocated once and reused: two for the reader thread and two for ``load``
(each thread owns its pair, so they never contend). A file goes through its pair in chunks of at most
``STAGING_NUMEL`` elements, alternating between the two buffers; reading chunk j + 1 from the file overlaps
copying chunk j to the device, and a buffer is refilled only after the event recorded behind the copy out
of it has completed. Chunking keeps the page-locked memory of a session at most 4 x 8 MiB, whatever the size
of its shards (page-locked memory cannot be swapped, and a worker keeps several sessions).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from worker.engine.spill_store import read_file

STAGING_NUMEL = 1 << 21  # fp32 elements per page-locked staging buffer (8 MiB): a chunk of a file on its way in


class _Staging:
    """Two page-locked buffers that files stream through to the device; used by one thread only.

    Chunk after chunk (counting on across calls) alternates between the buffers. Before a buffer is
    refilled, the host waits for the event recorded behind the last copy out of it, so a copy still in
    flight never reads a half-overwritten buffer. Nothing is ever left busy: a copy completes whether or not
    anyone wants its result, and the next refill waits for exactly that copy.
    """

    def __init__(self, numel: int) -> None:
        self._buffers = [torch.empty(numel, dtype=torch.float32, pin_memory=True) for _ in range(2)]
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0

    def copy(self, path: Path, out: torch.Tensor, *, offset: int) -> None:
        """Fill the 1-D fp32 device tensor ``out`` with the values of ``path`` from byte ``offset``.

        The copies are queued on the current stream of ``out``'s device.
        Raises what :func:`read_file` raises (``FileNotFoundError``, ``SpillStoreError`` for a short file).
        """
        stream = torch.cuda.current_stream(out.device)
        size = self._buffers[0].numel()
        for start in range(0, out.numel(), size):
            stop = min(out.numel(), start + size)
            turn, self._turn = self._turn, 1 - self._turn
            copied = self._copied[turn]
            if copied is not None:
                copied.synchronize()  # the buffer's previous copy to the device has finished
            host = read_file(path, self._buffers[turn][: stop - start], offset=offset + start * out.element_size())
            out[start:stop].copy_(host, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(stream)
            self._copied[turn] = copied


_Read = tuple[torch.Tensor, torch.cuda.Event | None]  # a background read's tensor, and on CUDA its copy's event


class Transfers:
    """Moves spill buffers to the device for one ``TrialSession``: synchronous loads, and background
    prefetch keyed by (buffer name, version) so that a read made stale by a later commit is never used.

    Values are fp32, read from raw files (:mod:`worker.engine.spill_store`); the caller counts the bytes
    it reads (``tensor.nbytes`` of what :meth:`take` and :meth:`load` return). Call it from one thread:
    the reader thread is internal. ``max_numel`` is the largest buffer the session loads, in elements; it
    only bounds the staging buffers (``min(max_numel, STAGING_NUMEL)`` elements each), so larger loads
    still work, in more chunks.

    At most one background read runs at a time, in the order started; on CUDA at most two of its chunk
    copies are in flight, one per staging buffer. A read started while others are queued waits for them
    (and the reader, for the staging buffer it needs next); :meth:`start` itself never blocks. Each read
    holds its device tensor from when the reader gets to it until it is taken or forgotten
    (:meth:`retain`), so start only what the next units will take.
    """

    def __init__(self, device: torch.device, max_numel: int) -> None:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())  # the reader thread's default may differ
        self.device = device
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hydra-prefetch")
        self._reads: dict[tuple[str, int], Future[_Read]] = {}
        self.wait_s = 0.0  # seconds the caller's thread spent loading, or waiting for background reads
        self.copy_stream: torch.cuda.Stream | None = None
        if device.type == "cuda":
            self.copy_stream = torch.cuda.Stream(device)
            numel = max(1, min(max_numel, STAGING_NUMEL))
            self._reader_staging = _Staging(numel)  # used by the reader thread only
            self._load_staging = _Staging(numel)  # used by the caller's thread only

    def start(self, key: tuple[str, int], path: Path, numel: int) -> None:
        """Begin reading ``numel`` fp32 values of ``path`` (from byte 0) in the background; on CUDA also copy
        them to the device on :attr:`copy_stream`. A no-op if ``key`` was started and not taken since.
        Raises ``RuntimeError`` after :meth:`close`."""
        if key in self._reads:
            return
        read = self._read_to_device if self.copy_stream is not None else self._read_to_host
        self._reads[key] = self._pool.submit(read, path, numel)

    def take(self, key: tuple[str, int]) -> torch.Tensor | None:
        """The values started under ``key`` as a 1-D fp32 tensor on the device, or ``None`` if ``key`` was
        not started (or was forgotten). Waits on the host for the file read only; on CUDA the current
        stream is made to wait for the copy (``wait_event``, no host sync), and the tensor is marked as used
        by that stream, so the caching allocator does not hand its memory to the copy stream again before
        the current stream is done with it. Raises what the background read raised (``FileNotFoundError``,
        ``SpillStoreError`` for a file shorter than ``numel`` values, ``torch.OutOfMemoryError``).
        """
        read = self._reads.pop(key, None)
        if read is None:
            return None
        start = time.perf_counter()
        tensor, copied = read.result()
        self.wait_s += time.perf_counter() - start
        if copied is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(copied)
            tensor.record_stream(stream)
        return tensor

    def pending(self) -> list[tuple[str, int]]:
        """The keys started and not yet taken or forgotten."""
        return sorted(self._reads)

    def retain(self, current: dict[str, int]) -> None:
        """Forget started reads whose version is no longer current (``current``: buffer name -> version).

        A forgotten read not yet begun is cancelled; one under way finishes in the background and is
        dropped, freeing its device tensor.
        """
        for key in [k for k in self._reads if current.get(k[0]) != k[1]]:
            self._reads.pop(key).cancel()

    def load(self, path: Path, numel: int, *, offset: int = 0) -> torch.Tensor:
        """``numel`` fp32 values of ``path`` from byte ``offset``, as a new 1-D tensor on the device, ready
        on the current stream: on CUDA copied through this thread's own staging buffers on the current
        stream (so no prefetch's buffers are touched). Raises ``FileNotFoundError``, or ``SpillStoreError``
        if the file is shorter than ``offset + 4 * numel`` bytes."""
        start = time.perf_counter()
        if self.copy_stream is None:
            out = read_file(path, torch.empty(numel, dtype=torch.float32), offset=offset)
        else:
            out = torch.empty(numel, dtype=torch.float32, device=self.device)
            self._load_staging.copy(path, out, offset=offset)
        self.wait_s += time.perf_counter() - start
        return out

    def close(self) -> None:
        """Forget every started read and stop the reader thread, after the read it is doing (if any).
        Idempotent; after it only :meth:`load` and :meth:`take` (which returns ``None``) may be called."""
        self._reads.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _read_to_host(self, path: Path, numel: int) -> _Read:
        return read_file(path, torch.empty(numel, dtype=torch.float32)), None

    def _read_to_device(self, path: Path, numel: int) -> _Read:
        """On the reader thread: stream ``path`` to a new device tensor on the copy stream; return the
        tensor and an event recorded behind its last chunk's copy."""
        assert self.copy_stream is not None, "only CUDA transfers read to the device"
        # Threads do not inherit the current device: set it, and make the copy stream current.
        with torch.cuda.device(self.device), torch.cuda.stream(self.copy_stream):
            # Allocated while the copy stream is current, so the caching allocator serves it from memory freed
            # on the copy stream's side only: earlier copies there are ordered before this one by the stream
            # itself, and uses on the compute stream were declared by take's record_stream, which keeps a block
            # from coming back here until the compute stream's work on it is done. So the copy never
            # overwrites memory a kernel still reads. The reverse way round (allocating on the compute stream)
            # would also need the copy stream to wait for the compute stream, giving up the overlap.
            out = torch.empty(numel, dtype=torch.float32, device=self.device)
            self._reader_staging.copy(path, out, offset=0)
            copied = torch.cuda.Event()
            copied.record(self.copy_stream)
        return out, copied
