"""The telemetry ingest's pass over a host: what the workers measured is stored, then what they report about
trials is applied.

Metrics come first (`webapp.telemetry.services.telemetry_store`), so that when a trial's "finished" event is
applied its last metrics are stored; the events then go to the one service that applies them
(`webapp.experiments.events.trial_events_sync`). ``manage.py hydra_ingest`` runs a pass per host every second.
"""

from __future__ import annotations

from webapp.experiments.events import trial_events_sync
from webapp.telemetry.services import BATCH_SIZE, telemetry_store


def telemetry_ingest(*, host_id: str, batch_size: int = BATCH_SIZE, max_batches: int = 50) -> dict[str, int]:
    """Store what is new in each telemetry stream of `host_id`, then apply its trial events; return the entries
    read per stream (``events`` included). At most `max_batches` batches of each per call; Redis errors
    propagate, every cursor staying where it was."""
    read = telemetry_store(host_id=host_id, batch_size=batch_size, max_batches=max_batches)
    read["events"] = trial_events_sync(host_id=host_id, max_batches=max_batches)
    return read
