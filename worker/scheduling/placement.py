"""Which host of a lab a new trial goes to. Pure; the queue reports each host's load.

A lab with several GPU servers runs one web app, one PostgreSQL and one Redis, and device workers on each
server under its own host id (every Redis key of a host is under ``hydra:<host>:``). Device workers register
their host when they start (`ShardQueue.register_host`), and `ShardQueue.load` says what a host holds. A new
trial goes to a host that can take it: one whose devices answered lately and whose host tier can hold the
trial's spill store at all (it may wait there for room, see `ShardQueue.claim_plan`); of those, the least
loaded, by trials with work per live device, then the most free host memory, then the host id. With no such
host (no worker answered yet), the web app's own host takes it, as with a single server.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class HostLoad:
    """A host as placement sees it: devices seen in the last minute, its host tier's capacity for spill
    stores (0: no limit) and what admitted trials take of it, and its trials with work (waiting to be
    planned, runnable or running)."""

    host_id: str
    live_devices: int
    capacity_bytes: int
    admitted_bytes: int
    trials: int

    def can_hold(self, host_bytes: int) -> bool:
        return self.live_devices > 0 and (self.capacity_bytes == 0 or host_bytes <= self.capacity_bytes)

    def free_bytes(self) -> float:
        return float("inf") if self.capacity_bytes == 0 else self.capacity_bytes - self.admitted_bytes


def place(hosts: Iterable[HostLoad], host_bytes: int, default: str) -> str:
    """The host a trial whose spill store takes `host_bytes` goes to (see the module docstring)."""
    able = [h for h in hosts if h.can_hold(host_bytes)]
    if not able:
        return default
    return min(able, key=lambda h: ((h.trials + 1) / h.live_devices, -h.free_bytes(), h.host_id)).host_id
