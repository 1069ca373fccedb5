"""Telemetry in Redis streams: written in the unit's own round trip, read by the web app with a cursor.

Streams of a host (``XRANGE hydra:<host>:spans - +`` shows them):

    hydra:<host>:spans     one entry per unit: trial, device, unit, step, micro_batch, phase, shard,
                           start, end (epoch seconds), bytes_moved, peak_bytes, pid
    hydra:<host>:steps     one entry per optimizer step: trial, step, loss, lr, tokens, time; a DPO trial's
                           also rewards_chosen, rewards_rejected, reward_accuracy
    hydra:<host>:evals     one entry per evaluation: trial, step, loss, perplexity, time, bpb (bits per
                           byte, -1: unknown), tokens and bytes it covered, final (1: the final evaluation
                           on the declared held-out set, its step the steps trained); a DPO trial's also
                           rewards_chosen, rewards_rejected, reward_margin, reward_accuracy
    hydra:<host>:samples   one entry per device per second: device, time, utilization (0..1),
                           memory_used, memory_total (bytes)
    hydra:<host>:checkpoints  one entry per durable checkpoint written: trial, step, time (when its
                           state was taken), bytes
    hydra:<host>:events    trial state changes (written by the queue's scripts): trial, state, message

The key prefix and the stream caps are defined in `worker.scheduling.keys`: each stream is capped
(approximately `STREAM_MAXLEN` entries; the events stream `EVENTS_MAXLEN`), so a web app that stops
draining them loses the oldest entries rather than the host's memory. The web app keeps, per stream, the
id of the last entry it stored and calls `read` with it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import psutil
import redis

from worker.scheduling.keys import STREAM_MAXLEN, host_prefix

log = logging.getLogger(__name__)

SAMPLE_PERIOD_S = 1.0

# Field types per stream; everything else reads back as a string.
FIELD_TYPES: dict[str, dict[str, Callable[[str], object]]] = {
    "spans": {
        "unit": int, "step": int, "micro_batch": int, "shard": int, "start": float, "end": float,
        "bytes_moved": int, "peak_bytes": int, "pid": int,
    },
    "steps": {"step": int, "loss": float, "lr": float, "tokens": int, "time": float, "rewards_chosen": float,
              "rewards_rejected": float, "reward_accuracy": float},
    "evals": {"step": int, "loss": float, "perplexity": float, "time": float, "bpb": float, "tokens": int,
              "bytes": int, "final": int, "rewards_chosen": float, "rewards_rejected": float, "reward_margin": float,
              "reward_accuracy": float},
    "samples": {"time": float, "utilization": float, "memory_used": int, "memory_total": int},
    "checkpoints": {"step": int, "time": float, "bytes": int},
    "events": {},
}
STREAMS = tuple(FIELD_TYPES)


@dataclass(frozen=True)
class Span:
    """One unit that ran on a device. ``phase`` is the engine's (R, F, FB, B, E, S) or ``plan``; ``io_s`` is the
    part of ``end - start`` spent moving the trial's state to and from the spill store."""

    trial: str
    device: str
    unit: int
    step: int
    micro_batch: int
    phase: str
    shard: int
    start: float
    end: float
    bytes_moved: int
    peak_bytes: int
    pid: int
    io_s: float = 0.0


@dataclass(frozen=True)
class StepMetrics:
    """One optimizer step's training loss; ``step`` is the engine's 0-based index of the step. A DPO trial's step
    also has the mean implicit rewards of its batch's chosen and rejected answers and the share of its pairs whose
    chosen reward is the higher (None for other trials: the stream entry leaves them out)."""

    trial: str
    step: int
    loss: float
    lr: float
    tokens: int
    time: float
    rewards_chosen: float | None = None
    rewards_rejected: float | None = None
    reward_accuracy: float | None = None


@dataclass(frozen=True)
class EvalMetrics:
    """An evaluation after the step of 0-based index ``step``; ``final`` for the trial's last one. A DPO trial's
    ``loss`` is its mean pair loss, its ``perplexity``, ``bpb``, ``tokens`` and ``bytes`` are its chosen answers',
    and it has the rewards, their margin and the preference accuracy (None for other trials: the stream entry leaves
    them out)."""

    trial: str
    step: int
    loss: float
    perplexity: float
    time: float
    bpb: float = -1.0  # Redis streams hold no None: -1 for an evaluation without byte counts
    tokens: int = 0
    bytes: int = 0
    final: int = 0
    rewards_chosen: float | None = None
    rewards_rejected: float | None = None
    reward_margin: float | None = None
    reward_accuracy: float | None = None


@dataclass(frozen=True)
class CheckpointMetrics:
    """A durable checkpoint written: trial `trial`'s state after `step` optimizer steps, as it was at `time`."""

    trial: str
    step: int
    time: float
    bytes: int


@dataclass(frozen=True)
class Batch:
    """Entries after a cursor, oldest first, and the cursor to pass next time."""

    entries: list[dict[str, object]]
    cursor: str


def stream_key(host_id: str, stream: str) -> str:
    """The Redis key of `stream` (one of `STREAMS`) of host `host_id`."""
    if stream not in FIELD_TYPES:
        raise ValueError(f"unknown telemetry stream {stream!r}; use one of {list(STREAMS)}.")
    return host_prefix(host_id) + stream


def add(pipe: redis.client.Pipeline, host_id: str, stream: str,
        record: Span | StepMetrics | EvalMetrics | CheckpointMetrics) -> None:
    """Queue an XADD of `record` on `pipe` (the caller executes it with its other commands). The records are
    flat (numbers and strings), so their fields go as they are (`dataclasses.asdict` would deep-copy each
    one, a cost in every unit's round trip); a field that is None is left out of the entry."""
    fields = {name: value for name, value in vars(record).items() if value is not None}
    pipe.xadd(stream_key(host_id, stream), fields, maxlen=STREAM_MAXLEN, approximate=True)


def add_all(
    pipe: redis.client.Pipeline, host_id: str, *, span: Span, steps: Iterable[StepMetrics],
    evals: Iterable[EvalMetrics],
) -> None:
    """Queue a unit's span and the step and eval metrics it produced."""
    add(pipe, host_id, "spans", span)
    for step in steps:
        add(pipe, host_id, "steps", step)
    for evaluation in evals:
        add(pipe, host_id, "evals", evaluation)


def read(client: redis.Redis, host_id: str, stream: str, *, after: str = "0-0", count: int = 1000) -> Batch:
    """Up to `count` entries of `stream` after entry id `after`, typed, each with its ``id``.

    The returned cursor is the last entry's id (or `after` when there is nothing new). `client` must
    decode responses.
    """
    if count < 1:
        raise ValueError(f"count={count} must be at least 1.")
    raw = client.xrange(stream_key(host_id, stream), min=f"({after}", max="+", count=count)
    types = FIELD_TYPES[stream]
    entries = [{"id": entry_id, **_typed(fields, types)} for entry_id, fields in raw]
    return Batch(entries=entries, cursor=raw[-1][0] if raw else after)


def _typed(fields: Mapping[str, str], types: Mapping[str, Callable[[str], object]]) -> dict[str, object]:
    return {name: types[name](value) if name in types else value for name, value in fields.items()}


class DeviceSampler:
    """A daemon thread that writes this device's utilization and memory every `SAMPLE_PERIOD_S`.

    GPUs are read through NVML (``nvidia-ml-py``) by their physical index; a CPU device reports the CPU
    use of this process over its `threads` and the host's memory.
    """

    def __init__(self, client: redis.Redis, host_id: str, *, device: str, kind: str, index: int, threads: int):
        self.client = client
        self.host_id = host_id
        self.device = device
        self._read = self._nvml_reader(index) if kind == "cuda" else self._cpu_reader(threads)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hydra-sampler-{device}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:  # a first sample at once, so that even a device that ran for a moment shows up
            utilization, used, total = self._read()
            fields = {"device": self.device, "time": time.time(), "utilization": utilization,
                      "memory_used": used, "memory_total": total}
            try:
                self.client.xadd(stream_key(self.host_id, "samples"), fields, maxlen=STREAM_MAXLEN,
                                 approximate=True)
            except redis.RedisError as error:  # a lost sample is not worth stopping the device for
                log.warning("device sample of %s not written: %s", self.device, error)
            if self._stop.wait(SAMPLE_PERIOD_S):
                return

    @staticmethod
    def _cpu_reader(threads: int) -> Callable[[], tuple[float, int, int]]:
        process = psutil.Process(os.getpid())
        process.cpu_percent(None)  # the first call only starts the measurement

        def read() -> tuple[float, int, int]:
            memory = psutil.virtual_memory()
            busy = process.cpu_percent(None) / 100.0 / max(1, threads)
            return min(1.0, busy), int(process.memory_info().rss), int(memory.total)

        return read

    @staticmethod
    def _nvml_reader(index: int) -> Callable[[], tuple[float, int, int]]:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)

        def read() -> tuple[float, int, int]:
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return rates.gpu / 100.0, int(memory.used), int(memory.total)

        return read
