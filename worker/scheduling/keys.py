"""The Redis names a host's queue and telemetry share: the key prefix of a host and the stream caps.

Every key of a host starts with `host_prefix` so that several hosts can share one Redis. The queue's keys are
listed in `worker.scheduling.queue`, the telemetry streams in `worker.scheduling.telemetry`.

Streams are capped approximately (``XADD ... MAXLEN ~``), so a reader that stops draining them loses the
oldest entries rather than the host's memory.
"""

from __future__ import annotations

# Cap of each telemetry stream (spans, steps, evals, samples).
STREAM_MAXLEN = 200_000
# Cap of the events stream (trial state changes), written by the queue's Lua scripts.
EVENTS_MAXLEN = 100_000


# The hosts whose device workers started against this Redis: host id -> when the last one did (ms, Redis clock).
HOSTS_KEY = "hydra:hosts"


def host_prefix(host_id: str) -> str:
    """The start of every Redis key of host `host_id`: ``hydra:<host>:``."""
    return f"hydra:{host_id}:"
