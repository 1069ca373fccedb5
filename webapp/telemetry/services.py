"""Copy the workers' telemetry from a host's Redis streams into the database, in batches, exactly once.

`telemetry_store` drains each stream after the cursor stored for it: one transaction per batch inserts the
rows (``bulk_create`` with ``ignore_conflicts``, so a replayed batch inserts nothing twice) and advances the
cursor. A crash between the two only replays that batch. Entries of trials that no longer exist (deleted
since), or of an attempt that a retry replaced, are dropped. A batch the database refuses is stored again one
entry at a time, and an entry that still cannot be stored is skipped and listed on the health page
(`SkippedEntry`), so that one bad entry never stops a stream: only Redis or the database out of reach
(`TRANSIENT`) does, and the batch is then read again. Trial state changes are not telemetry: the
ingest's pass (`webapp.experiments.ingest`) hands them, after the metrics, to the one service that applies
them.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import redis
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Q

from webapp import queue_client
from webapp.ground.models import Trial
from webapp.health.models import SkippedEntry
from webapp.telemetry import levels
from webapp.telemetry.models import DeviceSample, EvalMetric, SampleLane, StepMetric, StreamCursor, UnitSpan

log = logging.getLogger(__name__)

Entry = Mapping[str, Any]
# A DPO trial's metrics beside the loss (absent from other trials' entries: stored as null).
STEP_REWARDS = ("rewards_chosen", "rewards_rejected", "reward_accuracy")
EVAL_REWARDS = ("rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy")
STREAM_ORDER = ("steps", "evals", "spans", "samples", "checkpoints")
BATCH_SIZE = 2000
# Failures that may pass: the batch is read again whole. Anything else an entry raises is that entry's own.
TRANSIENT = (redis.RedisError, queue_client.SchedulerUnavailable, OperationalError, InterfaceError)


def telemetry_store(*, host_id: str, batch_size: int = BATCH_SIZE, max_batches: int = 50) -> dict[str, int]:
    """Store what is new in each stream of `host_id`; return the entries read per stream.

    At most `max_batches` batches of `batch_size` entries per stream per call, so one busy stream cannot
    starve the others; call again (the `hydra_ingest` command loops) to go on. Redis errors propagate: the
    cursors stay where they were.
    """
    read: dict[str, int] = {}
    for stream in STREAM_ORDER:
        read[stream] = 0
        cursor, _ = StreamCursor.objects.get_or_create(host=host_id, stream=stream)
        for _ in range(max_batches):
            entries, after = queue_client.telemetry_read(stream=stream, after=cursor.cursor, count=batch_size,
                                                         host_id=host_id)
            if not entries:
                break
            with transaction.atomic():
                _store_each(host_id, stream, entries)
                StreamCursor.objects.filter(pk=cursor.pk).update(cursor=after)
            cursor.cursor = after
            read[stream] += len(entries)
            if len(entries) < batch_size:
                break
    return read


def _store_each(host_id: str, stream: str, entries: list[Entry]) -> None:
    """Store `entries` as one batch, or when the batch fails, one entry at a time, skipping those that fail."""
    try:
        with transaction.atomic():
            STORES[stream](host_id, entries)
        return
    except TRANSIENT:
        raise
    except Exception:  # some entry of the batch: find it below
        log.warning("a batch of %s on %s failed; storing it entry by entry", stream, host_id, exc_info=True)
    for entry in entries:
        try:
            with transaction.atomic():
                STORES[stream](host_id, [entry])
        except TRANSIENT:
            raise
        except Exception as error:  # this entry alone: skipped, and shown on the health page
            log.exception("%s entry %s on %s skipped", stream, entry.get("id"), host_id)
            SkippedEntry.objects.create(host=host_id, stream=stream, entry_id=str(entry.get("id", ""))[:40],
                                        trial=str(entry.get("trial", ""))[:64],
                                        error=f"{type(error).__name__}: {error}"[:1000])


class Attempt(NamedTuple):
    trial_id: int
    attempt: int


def _attempts(entries: Iterable[Entry]) -> dict[str, Attempt]:
    """Queue id -> (Trial pk, attempt) for the entries whose queue id is a trial's current attempt.

    A retried trial gets a new queue id, so stragglers of its old attempt are dropped here.
    """
    ids = {str(e["trial"]) for e in entries}
    rows = Trial.objects.filter(queue_id__in=ids).values_list("queue_id", "pk", "attempt")
    return {queue_id: Attempt(pk, attempt) for queue_id, pk, attempt in rows}


def steps_done(entry: Entry) -> int:
    """The steps done when a step or evaluation entry was measured: the workers number steps from 0, the web app
    counts them from 1 (`webapp.telemetry.models`)."""
    return int(entry["step"]) + 1


def _store_steps(host_id: str, entries: list[Entry]) -> None:
    attempts = _attempts(entries)
    rows = [
        StepMetric(trial_id=attempts[e["trial"]].trial_id, attempt=attempts[e["trial"]].attempt, step=steps_done(e),
                   loss=e["loss"], lr=e["lr"], tokens=e["tokens"], time=e["time"],
                   **{name: e.get(name) for name in STEP_REWARDS})
        for e in entries if e["trial"] in attempts
    ]
    StepMetric.objects.bulk_create(rows, ignore_conflicts=True)
    for trial_id, attempt in set(attempts.values()):
        steps = [row.step for row in rows if row.trial_id == trial_id]
        if steps:
            _update_levels(trial_id, attempt, min(steps), max(steps))
            # `Trial.step` counts the steps done (shown as "done / total"). It only moves forward (a replayed
            # batch is older). A monotonic UPDATE, not the status service: it is not a state change and must not
            # race with one.
            done = max(steps)
            Trial.objects.filter(pk=trial_id, attempt=attempt, step__lt=done).update(step=done)


def _update_levels(trial_id: int, attempt: int, first_step: int, last_step: int) -> None:
    """Recompute the levels of detail of every bucket that steps `first_step`..`last_step` fall into."""
    for level in range(1, levels.MAX_LEVEL + 1):
        width = levels.bucket_width(level)
        rows = list(
            StepMetric.objects.filter(
                trial_id=trial_id, attempt=attempt, level__gte=level - 1,
                step__gte=first_step // width * width, step__lt=(last_step // width + 1) * width,
            ).values_list("id", "step", "loss", "level")
        )
        keep = levels.representatives((levels.Point(i, s, loss) for i, s, loss, _ in rows), level)
        promote = [i for i, _, _, lv in rows if i in keep and lv < level]
        demote = [i for i, _, _, lv in rows if i not in keep and lv >= level]
        if promote:
            StepMetric.objects.filter(pk__in=promote).update(level=level)
        if demote:
            StepMetric.objects.filter(pk__in=demote).update(level=level - 1)


def _store_evals(host_id: str, entries: list[Entry]) -> None:
    attempts = _attempts(entries)
    rows = [
        EvalMetric(trial_id=attempts[e["trial"]].trial_id, attempt=attempts[e["trial"]].attempt, step=steps_done(e),
                   loss=e["loss"], perplexity=e["perplexity"], bpb=_bpb(e), time=e["time"],
                   **{name: e.get(name) for name in EVAL_REWARDS})
        for e in entries if e["trial"] in attempts
    ]
    EvalMetric.objects.bulk_create(rows, ignore_conflicts=True)
    for e in entries:  # the final evaluation, on the declared held-out set: the trial's figures (the last wins)
        if e.get("final") and e["trial"] in attempts:
            trial_id, attempt = attempts[e["trial"]]
            done = steps_done(e)
            Trial.objects.filter(Q(final_step__isnull=True) | Q(final_step__lte=done), pk=trial_id,
                                 attempt=attempt).update(final_bpb=_bpb(e), final_loss=e["loss"],
                                                         final_ppl=e["perplexity"], final_step=done,
                                                         final_eval_bytes=e.get("bytes") or None,
                                                         final_reward_accuracy=e.get("reward_accuracy"),
                                                         final_reward_margin=e.get("reward_margin"))
    for trial_id, attempt in {(row.trial_id, row.attempt) for row in rows}:
        best = min((row for row in rows if row.trial_id == trial_id), key=lambda row: row.loss)
        # Only ever an improvement, whatever order batches arrive in.
        Trial.objects.filter(Q(best_val_loss__isnull=True) | Q(best_val_loss__gt=best.loss),
                             pk=trial_id, attempt=attempt).update(best_val_loss=best.loss,
                                                                  best_val_ppl=best.perplexity)


def _bpb(entry: Entry) -> float | None:
    """An evaluation's bits per byte; None for one without byte counts (-1 in the stream) or an older entry."""
    bpb = entry.get("bpb", -1.0)
    return None if bpb < 0 else bpb


def _store_spans(host_id: str, entries: list[Entry]) -> None:
    attempts = _attempts(entries)
    UnitSpan.objects.bulk_create(
        [
            UnitSpan(trial_id=attempts[e["trial"]].trial_id, host=host_id, entry_id=e["id"], device=e["device"],
                     unit=e["unit"], step=e["step"], micro_batch=e["micro_batch"], phase=e["phase"],
                     shard=e["shard"], start=e["start"], end=e["end"], bytes_moved=e["bytes_moved"],
                     peak_bytes=e["peak_bytes"])
            for e in entries if e["trial"] in attempts
        ],
        ignore_conflicts=True,
    )


def _store_samples(host_id: str, entries: list[Entry]) -> None:
    DeviceSample.objects.bulk_create(
        [
            DeviceSample(host=host_id, entry_id=e["id"], device=e["device"], time=e["time"],
                         utilization=e["utilization"], memory_used=e["memory_used"],
                         memory_total=e["memory_total"])
            for e in entries
        ],
        ignore_conflicts=True,
    )
    # The devices the compaction goes through (one small insert per batch; known devices insert nothing).
    devices = {e["device"] for e in entries}
    SampleLane.objects.bulk_create([SampleLane(host=host_id, device=device) for device in devices],
                                   ignore_conflicts=True)


def _store_checkpoints(host_id: str, entries: list[Entry]) -> None:
    """Each trial's last durable checkpoint (the newest state taken: entries of one trial may come from
    several devices, out of order)."""
    attempts = _attempts(entries)
    newest: dict[Attempt, Entry] = {}
    for e in entries:
        attempt = attempts.get(e["trial"])
        if attempt is not None and (attempt not in newest or e["time"] > newest[attempt]["time"]):
            newest[attempt] = e
    for (trial_id, attempt), e in newest.items():
        taken = datetime.datetime.fromtimestamp(e["time"], tz=datetime.UTC)
        Trial.objects.filter(Q(checkpoint_at__isnull=True) | Q(checkpoint_at__lt=taken), pk=trial_id,
                             attempt=attempt).update(checkpoint_step=e["step"], checkpoint_at=taken)


STORES: dict[str, Callable[[str, list[Entry]], None]] = {
    "steps": _store_steps,
    "evals": _store_evals,
    "spans": _store_spans,
    "samples": _store_samples,
    "checkpoints": _store_checkpoints,
}
