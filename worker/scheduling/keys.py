"""Every Redis key of a host: its name, its type and what it holds, in one table (`HOST_KEYS`).

Every key of a host starts with `host_prefix` (``hydra:<host>:``) so that several hosts can share one Redis.
The shard queue keeps most of them (`worker.scheduling.queue`: every change of a trial is one of its Lua
scripts), the telemetry streams are `worker.scheduling.telemetry`'s, and `worker.api` keeps the heartbeats
and roles. Outside every host's prefix are `HOSTS_KEY` and the pruner's studies (`worker.scheduling.pruning`).
Names are written as patterns: ``<id>`` stands for a trial id, ``<team>``, ``<priority>``, ``<device>``,
``<base>`` and ``<role>`` for what they say (`PLACEHOLDERS`). ``python -m worker.scheduling.keys`` prints the
table as ``docs/scheduler.md`` shows it.

Streams are capped approximately (``XADD ... MAXLEN ~``), so a reader that stops draining them loses the
oldest entries rather than the host's memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Cap of each telemetry stream (spans, steps, evals, samples, checkpoints).
STREAM_MAXLEN = 200_000
# Cap of the events stream (trial state changes), written by the queue's Lua scripts.
EVENTS_MAXLEN = 100_000

# The hosts whose device workers started against this Redis: host id -> when the last one did (ms).
HOSTS_KEY = "hydra:hosts"


def host_prefix(host_id: str) -> str:
    """The start of every Redis key of host `host_id`: ``hydra:<host>:``."""
    return f"hydra:{host_id}:"


@dataclass(frozen=True)
class Key:
    """A key of a host, after its prefix: `pattern` (placeholders in ``<>``), its Redis `type` (as TYPE names
    it) and what it `holds`. `fields`: for a hash whose fields have fixed names, all of them."""

    pattern: str
    type: str
    holds: str
    fields: tuple[str, ...] = ()


# What a trial id and a team may be ('' is the team of trials submitted without one): never a ':', so that the
# keys named after them cannot be mistaken for one another.
TRIAL_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
TEAM = r"[A-Za-z0-9_.-]{0,64}"

# What each placeholder of a pattern matches.
PLACEHOLDERS = {
    "id": TRIAL_ID,
    "team": TEAM,
    "priority": r"[012]",
    "device": r"[^:]+",
    "base": r".+",
    "role": r"[^:]+",
}

TRIAL_FIELDS = (
    "state", "message", "control", "updated", "active",
    "job", "export_dir", "submitted", "team", "priority", "host_bytes", "lane_bytes", "width_cap", "width", "plan",
    "device", "last_device", "held_until", "held_lane", "next_base", "ready", "ready_v", "expired",
    "remaining_units", "unit_s", "units_done", "requeues", "replans",
    "undo_device", "undo_message", "undo_active", "undo_served",
)

HOST_KEYS: tuple[Key, ...] = (
    Key("trials", "zset", "trial id -> submit time (s): every trial of the host"),
    Key("trial:<id>", "hash",
        "the trial: state, message, control (a pause or cancel waiting for its unit to end), updated (s), "
        "active (set while it trains: its runnable/running flips publish no event); job (JSON), export_dir, "
        "submitted (s), team, priority, host_bytes, lane_bytes (more per device beyond the first its micro-batches "
        "run on at once), width_cap (the most devices its micro-batches and experiment allow), width (the most "
        "admission gave it room for), plan (JSON); device (of its last lease), last_device, held_until (ms: "
        "last_device keeps the activations of its held_lane until then), next_base (the shared base layers its "
        "next unit reads); ready (the lanes whose next unit can run, as of its store's commit ready_v), expired "
        "(lane=token of leases that expired, whose unit may have committed unreported); remaining_units, unit_s, "
        "units_done, requeues, replans; undo_* (what a speculative claim changed, for giving it back)",
        TRIAL_FIELDS),
    Key("trial:<id>:leases", "hash",
        "the trial's units in flight: lease token -> its lane (`plan` while it is planned) and device"),
    Key("planning", "list", "trials waiting to be planned (LPUSH in, RPOP out: FIFO)"),
    Key("planning_teams", "hash", "team -> its trials waiting to be planned"),
    Key("planning_blocked", "string",
        "set when the last admission scan could admit nothing; cleared by anything that could change that"),
    Key("planners", "hash", "device -> the trial it took to plan (one device plans while the others train)"),
    Key("runnable:<team>:<priority>", "zset",
        "trial id -> minus its remaining seconds, per team and priority (0 low, 1 normal, 2 high): what "
        "Sharded-LRTF picks from"),
    Key("runnable:<team>:<priority>:device:<device>", "zset", "the same, of the trials last run on the device"),
    Key("runnable:<team>:<priority>:base:<base>", "zset",
        "the same, of the trials whose next unit reads the shared base"),
    Key("widen:<team>:<priority>", "zset",
        "the same, of running trials that may take another device (a lane of their wavefront is free): what a "
        "device takes only when no trial without a unit in flight can run on it"),
    Key("held:<device>", "set", "trials the device may hold the activations of (checked on survey)"),
    Key("teams", "set", "teams with a trial runnable or running"),
    Key("team_work", "hash", "team -> how many of its trials are runnable or running"),
    Key("usage", "hash", "team -> decayed device seconds, and `<team>@` -> when that was last updated (ms)"),
    Key("weights", "hash", "team -> fair-share weight (absent: 1)"),
    Key("served", "hash", "team -> when its last unit was leased (ms)"),
    Key("quotas", "hash", "team -> most trials admitted at once (absent: no quota)"),
    Key("byte_quotas", "hash", "team -> most spill-store bytes admitted at once (absent: no quota)"),
    Key("admitted", "hash", "admitted trial -> its host bytes (planned and not ended: its spill store is here)"),
    Key("admitted_bytes", "string", "the sum of the admitted trials' host bytes"),
    Key("team_admitted", "hash", "team -> its admitted trials"),
    Key("team_bytes", "hash", "team -> its admitted trials' host bytes"),
    Key("leases", "zset", "`<trial id> <token>` -> lease expiry (ms): every unit (or planning) in flight"),
    Key("seq", "string", "lease token counter, never below the clock in ms x 1000"),
    Key("wake", "list", "wake-up tokens for idle devices (at most 64)"),
    Key("reap", "list", "trials that ended cancelled or failed, whose spill store a device of the host frees"),
    Key("config", "hash",
        "lease_ms (read at every claim), half_life_ms of teams' usage, capacity_bytes of the host tier its "
        "workers found and capacity_override_bytes an administrator set (admission)",
        ("lease_ms", "half_life_ms", "capacity_bytes", "capacity_override_bytes")),
    Key("device:<device>", "hash", "epoch of the device's current loop, stop, seen (its last survey, s)",
        ("epoch", "stop", "seen")),
    Key("heartbeats", "hash", "process name (ingest) -> its last pass (s), for /health/"),
    Key("role:<role>", "string", "the process holding a role (reconciler), expiring unless renewed"),
    Key("events", "stream",
        "trial, state, message (steps_done and rung when it ended): state changes for the web app, not the "
        "runnable/running flips between the units of a trial that goes on"),
    Key("spans", "stream", "telemetry: one entry per unit (`worker.scheduling.telemetry`)"),
    Key("steps", "stream", "telemetry: one entry per optimizer step"),
    Key("evals", "stream", "telemetry: one entry per evaluation"),
    Key("samples", "stream", "telemetry: one entry per device per second"),
    Key("checkpoints", "stream", "telemetry: one entry per durable checkpoint written"),
)


def _compiled(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"<([a-z]+)>", pattern)
    return re.compile("".join(f"(?:{PLACEHOLDERS[part]})" if i % 2 else re.escape(part)
                              for i, part in enumerate(parts)))


_MATCHERS = [(key, _compiled(key.pattern)) for key in HOST_KEYS]


def host_key(name: str) -> Key | None:
    """The entry of `HOST_KEYS` that key `name` (without the host prefix) is an instance of, or None."""
    for key, pattern in _MATCHERS:
        if pattern.fullmatch(name):
            return key
    return None


def markdown_table() -> str:
    """`HOST_KEYS` as a Markdown table (key, type, content)."""
    rows = ["| key | type | content |", "|---|---|---|"]
    rows += [f"| `{key.pattern}` | {key.type.upper()} | {key.holds} |" for key in HOST_KEYS]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
