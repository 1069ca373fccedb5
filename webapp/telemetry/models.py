"""What the workers measured, copied from the hosts' Redis streams into the database by `telemetry_store`.

A step or an evaluation is stored at the steps done when it was measured, counted from 1 as every page, the
API and `Trial.step` count them: a step's loss at the step it made (the first step's at 1), an evaluation after
``eval_every`` steps at ``eval_every``. (The workers number the engine's steps from 0; the ingest adds 1.)

Every row is idempotent on replay: a step and an evaluation are unique per trial, attempt and step; a span
and a device sample per host and Redis entry id. Re-reading a stream after a crash between the insert and the
cursor update therefore inserts nothing twice.
"""

from __future__ import annotations

from django.db import models

from webapp.ground.models import Trial


class StepMetric(models.Model):
    """One optimizer step of a trial. ``level`` is its level of detail (see `webapp.telemetry.levels`). A DPO
    trial's steps also have the mean implicit rewards of the chosen and rejected answers and the preference
    accuracy of their batch (TRL's rewards/*); other trials' leave them empty."""

    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="step_metrics")
    attempt = models.PositiveIntegerField(help_text="The trial's launch this step belongs to (a retry restarts).")
    step = models.PositiveIntegerField(help_text="The step it made, counted from 1.")
    loss = models.FloatField()
    lr = models.FloatField()
    tokens = models.BigIntegerField(help_text="Training tokens seen up to and including this step.")
    time = models.FloatField(help_text="When the step ended (epoch seconds).")
    level = models.PositiveSmallIntegerField(default=0)
    rewards_chosen = models.FloatField(null=True, blank=True, help_text="DPO: mean implicit reward of the chosen "
                                       "answers, beta x (log-prob under the model - under the reference).")
    rewards_rejected = models.FloatField(null=True, blank=True, help_text="DPO: that of the rejected answers.")
    reward_accuracy = models.FloatField(null=True, blank=True, help_text="DPO: the share of pairs whose chosen "
                                        "answer has the higher reward.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trial", "attempt", "step"], name="unique_step_metric")]
        # The dashboards read a trial's representatives of one level, in step order.
        indexes = [models.Index(fields=["trial", "attempt", "level", "step"], name="step_metric_level")]

    def __str__(self) -> str:
        return f"trial {self.trial_id} step {self.step}: loss {self.loss:.4f}"


class EvalMetric(models.Model):
    """One evaluation of a trial. A DPO trial's ``loss`` is the mean DPO loss of the held-out pairs, its
    ``perplexity`` and ``bpb`` those of their chosen answers, and it has the pairs' rewards, their margin and
    the preference accuracy."""

    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="eval_metrics")
    attempt = models.PositiveIntegerField()
    step = models.PositiveIntegerField(help_text="The steps done when it was measured.")
    loss = models.FloatField()
    perplexity = models.FloatField()
    bpb = models.FloatField(null=True, blank=True, help_text="Bits per byte of the text the evaluation covered.")
    time = models.FloatField(help_text="When the evaluation ended (epoch seconds).")
    rewards_chosen = models.FloatField(null=True, blank=True, help_text="DPO: mean implicit reward of the chosen "
                                       "answers.")
    rewards_rejected = models.FloatField(null=True, blank=True, help_text="DPO: that of the rejected answers.")
    reward_margin = models.FloatField(null=True, blank=True, help_text="DPO: mean chosen less rejected reward.")
    reward_accuracy = models.FloatField(null=True, blank=True, help_text="DPO: the share of pairs whose chosen "
                                        "answer has the higher reward (preference accuracy).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trial", "attempt", "step"], name="unique_eval_metric")]

    def __str__(self) -> str:
        return f"trial {self.trial_id} eval at step {self.step}: loss {self.loss:.4f}"


class UnitSpan(models.Model):
    """One shard unit (or a trial's planning or re-planning) that ran on a device, for the device timeline.
    A span of work on the whole trial has ``unit``, ``step`` and ``shard`` -1."""

    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="unit_spans")
    host = models.CharField(max_length=64)
    entry_id = models.CharField(max_length=40, help_text="The Redis stream entry id on its host.")
    device = models.CharField(max_length=32)
    unit = models.IntegerField()
    step = models.IntegerField()
    micro_batch = models.PositiveIntegerField()
    phase = models.CharField(max_length=16, help_text="F, FB, B, E, S, plan, replan (or synthetic).")
    shard = models.IntegerField()
    start = models.FloatField()
    end = models.FloatField()
    bytes_moved = models.BigIntegerField()
    peak_bytes = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "entry_id"], name="unique_unit_span")]
        indexes = [models.Index(fields=["trial", "end"], name="unit_span_trial_end")]

    def __str__(self) -> str:
        return f"trial {self.trial_id} {self.phase}{self.shard} on {self.host}/{self.device}"


class DeviceSample(models.Model):
    """A device's utilization and memory at one moment. Devices belong to a host, not to a team."""

    host = models.CharField(max_length=64)
    entry_id = models.CharField(max_length=40)
    device = models.CharField(max_length=32)
    time = models.FloatField()
    utilization = models.FloatField(help_text="0..1")
    memory_used = models.BigIntegerField()
    memory_total = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "entry_id"], name="unique_device_sample")]
        # The devices page and the compaction read one device's samples over a time range.
        indexes = [models.Index(fields=["time"], name="device_sample_time"),
                   models.Index(fields=["host", "device", "time"], name="device_sample_lane_time")]

    def __str__(self) -> str:
        return f"{self.host}/{self.device} at {self.time:.0f}: {self.utilization:.0%}"


class StreamCursor(models.Model):
    """The id of the last entry of a host's stream that is stored (``0-0`` before the first)."""

    host = models.CharField(max_length=64)
    stream = models.CharField(max_length=16)
    cursor = models.CharField(max_length=40, default="0-0")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "stream"], name="unique_stream_cursor")]

    def __str__(self) -> str:
        return f"{self.host}:{self.stream} @ {self.cursor}"


class SampleLane(models.Model):
    """A device that reported samples (noted at ingest), and the time before which its samples are compacted
    (`webapp.dashboards.compaction`): the compaction goes on from there, never over a time range twice."""

    host = models.CharField(max_length=64)
    device = models.CharField(max_length=32)
    compacted_before = models.FloatField(default=0.0, help_text="Epoch seconds.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "device"], name="unique_sample_lane")]

    def __str__(self) -> str:
        return f"{self.host}/{self.device} compacted before {self.compacted_before:.0f}"


class CompactedTrial(models.Model):
    """A trial whose telemetry of attempt ``attempt`` is compacted, so that later compactions pass it by. A
    retry starts a new attempt, which is compacted in its turn once it has ended long enough."""

    trial = models.OneToOneField(Trial, on_delete=models.CASCADE, primary_key=True, related_name="+")
    attempt = models.PositiveIntegerField()
    compacted = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"trial {self.trial_id} attempt {self.attempt} compacted"
