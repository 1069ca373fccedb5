"""Reads for the dashboards, as plain data: trials, downsampled curves, unit spans and device samples.

Every function takes objects the caller already fetched through `team_scoped_get`, so no read here can
reach another team's data. Long series are cut down in the database first (the levels of detail kept at
ingest, `webapp.telemetry.levels`) and then to the exact point budget here (`downsample`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, F, FloatField, Max, Min, Q, QuerySet, Sum

from webapp.dashboards.downsample import lttb, minmax
from webapp.ground.models import Experiment, Trial
from webapp.telemetry import levels
from webapp.telemetry.models import DeviceSample, EvalMetric, StepMetric, UnitSpan

TRAIN_POINTS = 400  # per trial per poll: 50 trials x 400 points x 4 columns stays well under 2 MB
# Rows read per trial may be up to this many times the budget (then LTTB picks exactly the budget): a level
# of detail is 8 times coarser than the next finer one, so reading exactly the budget could draw 8 x fewer.
READ_FACTOR = 4
EVAL_POINTS = 200
SPAN_LIMIT = 2000  # the most recent units drawn on the timeline; older ones are summarized by utilization
SAMPLE_BUCKETS = 300  # time buckets per device: min/max per bucket keeps every peak visible


@dataclass(frozen=True)
class TrialInfo:
    id: int
    number: int
    attempt: int
    experiment: str
    params: dict[str, Any]
    status: str
    step: int
    total_steps: int
    best_val_loss: float | None
    best_val_ppl: float | None
    launched: float | None  # the experiment's launch (epoch seconds): wall time is measured from it
    started: float | None = None  # when the trial began running, and ended (epoch seconds)
    finished: float | None = None
    rung: int | None = None  # the pruner's rung where a pruned trial stopped
    objective: str = "sft"  # its experiment's: a DPO trial's loss is the DPO loss of its pairs, not per token

    @property
    def label(self) -> str:
        return f"{self.experiment} #{self.number}"


@dataclass
class TrainSeries:
    step: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)


@dataclass
class EvalSeries:
    step: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    perplexity: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Cursor:
    """The last step and evaluation rows a page has: ask for what comes after them."""

    step: int = 0
    eval: int = 0


@dataclass(frozen=True)
class Curves:
    trials: list[TrialInfo]
    train: dict[int, TrainSeries]
    evals: dict[int, EvalSeries]
    cursor: Cursor


@dataclass(frozen=True)
class SpanRow:
    trial: int
    lane: str
    phase: str
    shard: int
    step: int
    start: float
    end: float
    peak_bytes: int


@dataclass
class SampleSeries:
    time: list[float] = field(default_factory=list)
    utilization: list[float] = field(default_factory=list)
    memory_used: list[int] = field(default_factory=list)
    memory_total: int = 0


@dataclass(frozen=True)
class Devices:
    spans: list[SpanRow]
    samples: dict[str, SampleSeries]
    origin: float | None
    cursor: int  # the last UnitSpan id
    sample_after: float  # the last sample time


def trial_infos(trials: Iterable[Trial]) -> list[TrialInfo]:
    return [
        TrialInfo(id=t.pk, number=t.number, attempt=t.attempt, experiment=t.experiment.name, params=dict(t.params),
                  status=t.status, step=t.step, total_steps=t.total_steps, best_val_loss=t.best_val_loss,
                  best_val_ppl=t.best_val_ppl,
                  launched=t.experiment.launched.timestamp() if t.experiment.launched else None,
                  started=t.started.timestamp() if t.started else None,
                  finished=t.finished.timestamp() if t.finished else None, rung=t.rung,
                  objective=t.experiment.objective)
        for t in trials
    ]


def experiment_trials(*, experiments: Sequence[Experiment]) -> list[TrialInfo]:
    trials = Trial.objects.filter(experiment__in=experiments).select_related("experiment")
    return trial_infos(trials.order_by("experiment__created", "experiment_id", "number"))


def experiment_is_running(*, experiment: Experiment) -> bool:
    return experiment.trials.filter(status__in=Trial.ACTIVE).exists()


def curves(*, trials: list[TrialInfo], after: Cursor | None = None) -> Curves:
    """The trials' train and eval series, downsampled to `TRAIN_POINTS`/`EVAL_POINTS` per trial.

    Without `after`: the whole history, read at the level of detail that fits the budget. With `after`:
    only rows stored since that cursor (a live page's poll), at full detail unless there are too many.
    """
    # The cursors come first, from the primary keys' index: a row stored while we read is left to the next poll.
    step_cursor = StepMetric.objects.aggregate(last=Max("pk"))["last"] or 0
    eval_cursor = EvalMetric.objects.aggregate(last=Max("pk"))["last"] or 0
    current = _current_attempts(trials)
    if after is None:
        # No primary-key range in SQL here: SQLite would prefer it to the (trial, attempt, level, step) index
        # and scan every row of the table. Rows newer than the cursor are skipped below instead.
        steps = StepMetric.objects.filter(_level_filter(trials))
        evals = EvalMetric.objects.filter(current)
    else:
        steps = StepMetric.objects.filter(current, pk__gt=after.step, pk__lte=step_cursor)
        evals = EvalMetric.objects.filter(current, pk__gt=after.eval, pk__lte=eval_cursor)
    train: dict[int, TrainSeries] = {t.id: TrainSeries() for t in trials}
    for pk, trial_id, step, tokens, time, loss in steps.order_by("trial_id", "step").values_list(
        "pk", "trial_id", "step", "tokens", "time", "loss"
    ):
        if pk > step_cursor:
            continue
        series = train[trial_id]
        series.step.append(step)
        series.tokens.append(tokens)
        series.time.append(time)
        series.loss.append(loss)
    eval_series: dict[int, EvalSeries] = {t.id: EvalSeries() for t in trials}
    for pk, trial_id, step, time, loss, perplexity in evals.order_by("trial_id", "step").values_list(
        "pk", "trial_id", "step", "time", "loss", "perplexity"
    ):
        if pk > eval_cursor:
            continue
        series = eval_series[trial_id]
        series.step.append(step)
        series.time.append(time)
        series.loss.append(loss)
        series.perplexity.append(perplexity)
    return Curves(
        trials=trials,
        train={tid: _thin_train(s) for tid, s in train.items()},
        evals={tid: _thin_evals(s) for tid, s in eval_series.items()},
        cursor=Cursor(step=step_cursor, eval=eval_cursor),
    )


def _current_attempts(trials: list[TrialInfo]) -> Q:
    """Rows of each trial's current attempt (a retry starts its curves afresh)."""
    clause = Q(pk__in=[])
    for trial in trials:
        clause |= Q(trial_id=trial.id, attempt=trial.attempt)
    return clause


def curve_level(steps: int) -> int:
    """The level of detail a learning curve of `steps` steps is read at: the finest whose representatives fit
    the read budget. An ended trial's curve is only ever read at this level and coarser ones."""
    return levels.level_for(max(steps, 1), READ_FACTOR * TRAIN_POINTS)


def _level_filter(trials: list[TrialInfo]) -> Q:
    """Per trial (current attempt), the finest level of detail whose representatives fit the read budget."""
    clause = Q(pk__in=[])
    for trial in trials:
        clause |= Q(trial_id=trial.id, attempt=trial.attempt, level__gte=curve_level(trial.step))
    return clause


def _thin_train(series: TrainSeries) -> TrainSeries:
    keep = lttb(series.step, series.loss, TRAIN_POINTS)
    if len(keep) == len(series.step):
        return series
    return TrainSeries(step=[series.step[i] for i in keep], tokens=[series.tokens[i] for i in keep],
                       time=[series.time[i] for i in keep], loss=[series.loss[i] for i in keep])


def _thin_evals(series: EvalSeries) -> EvalSeries:
    keep = lttb(series.step, series.loss, EVAL_POINTS)
    if len(keep) == len(series.step):
        return series
    return EvalSeries(step=[series.step[i] for i in keep], time=[series.time[i] for i in keep],
                      loss=[series.loss[i] for i in keep], perplexity=[series.perplexity[i] for i in keep])


@dataclass
class RewardSeries:
    """A DPO trial's rewards, as TRL logs them: per step the mean implicit reward of the chosen and of the rejected
    answers and the preference accuracy of its batch; per evaluation the held-out pairs' accuracy and margin."""

    step: list[int] = field(default_factory=list)
    chosen: list[float] = field(default_factory=list)
    rejected: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    eval_accuracy: list[float] = field(default_factory=list)
    eval_margin: list[float] = field(default_factory=list)


def reward_curves(*, trials: list[TrialInfo], until: Cursor, after: Cursor | None = None) -> dict[int, RewardSeries]:
    """The reward series of the DPO trials among `trials` (current attempt) from the rows up to the `until`
    cursor, the one `curves` answered, so that a page's poll gets every row once; trials without rewards (any
    other objective) are left out, so an empty answer means no DPO trial.

    Without `after`: the whole history at the curves' level of detail. With `after`: only the rows stored since
    that cursor (a live page's poll).
    """
    series: dict[int, RewardSeries] = defaultdict(RewardSeries)
    trials = [t for t in trials if t.objective == "dpo"]
    if not trials:  # no query for the other objectives' pages and polls
        return {}
    current = _current_attempts(trials)
    if after is None:  # as in `curves`: rows newer than the cursor are skipped here, not by a range in SQL
        steps = StepMetric.objects.filter(_level_filter(trials))
        evals = EvalMetric.objects.filter(current)
    else:
        steps = StepMetric.objects.filter(current, pk__gt=after.step, pk__lte=until.step)
        evals = EvalMetric.objects.filter(current, pk__gt=after.eval, pk__lte=until.eval)
    for pk, trial_id, step, chosen, rejected, accuracy in (
        steps.filter(rewards_chosen__isnull=False).order_by("trial_id", "step")
        .values_list("pk", "trial_id", "step", "rewards_chosen", "rewards_rejected", "reward_accuracy")
    ):
        if pk > until.step:
            continue
        one = series[trial_id]
        one.step.append(step)
        one.chosen.append(chosen)
        one.rejected.append(rejected)
        one.accuracy.append(accuracy)
    for pk, trial_id, step, accuracy, margin in (
        evals.filter(reward_accuracy__isnull=False).order_by("trial_id", "step")
        .values_list("pk", "trial_id", "step", "reward_accuracy", "reward_margin")
    ):
        if pk > until.eval:
            continue
        one = series[trial_id]
        one.eval_step.append(step)
        one.eval_accuracy.append(accuracy)
        one.eval_margin.append(margin)
    return dict(series)


def devices(*, experiment: Experiment, trials: list[TrialInfo], after: int | None = None,
            sample_after: float | None = None) -> Devices:
    """Unit spans of the experiment's trials (the latest `SPAN_LIMIT`, or those after span id `after`) and
    the samples of the devices they ran on since the experiment began (or since `sample_after`).

    Devices are shared between teams: a device's samples are shown only from the times this experiment's
    trials ran (`run_windows`), never from before or after, when another team's work had the device.
    """
    ids = [t.id for t in trials]
    spans = UnitSpan.objects.filter(trial_id__in=ids)
    if after is not None:
        spans = spans.filter(pk__gt=after)
    rows = list(
        spans.order_by("-pk").values_list("pk", "trial_id", "host", "device", "phase", "shard", "step", "start", "end",
                                          "peak_bytes")[:SPAN_LIMIT]
    )
    rows.reverse()
    cursor = rows[-1][0] if rows else (after or 0)
    origin = experiment_origin(experiment=experiment, trials=trials)
    lanes = device_lanes(trials)
    span_rows = [
        SpanRow(trial=trial, lane=lanes[(host, device)], phase=phase, shard=shard, step=step, start=start, end=end,
                peak_bytes=peak)
        for _, trial, host, device, phase, shard, step, start, end, peak in rows
    ]
    since = sample_after if sample_after is not None else (origin or 0.0)
    samples = _samples(lanes, since, run_windows(trials))
    last_sample = max((s.time[-1] for s in samples.values() if s.time), default=since)
    return Devices(spans=span_rows, samples=samples, origin=origin, cursor=cursor, sample_after=last_sample)


@dataclass(frozen=True)
class DeviceTime:
    """The device time a trial's units (its current attempt's and its earlier ones', planning included) took:
    per device (its lane name, seconds, units) and in all, beside the wall time from its first unit's start to
    its last unit's end, which is shorter when its micro-batches ran on several devices at once."""

    devices: list[tuple[str, float, int]]
    total_s: float
    wall_s: float


def trial_device_time(*, trial: Trial) -> DeviceTime | None:
    """`DeviceTime` of `trial`'s stored unit spans; None before any ran."""
    rows = list(UnitSpan.objects.filter(trial=trial).values("host", "device").annotate(
        seconds=Sum(F("end") - F("start"), output_field=FloatField()), units=Count("id"), first=Min("start"),
        last=Max("end")).order_by("host", "device"))
    if not rows:
        return None
    lanes = _lanes((row["host"], row["device"]) for row in rows)
    per_device = [(lanes[(row["host"], row["device"])], float(row["seconds"] or 0.0), int(row["units"]))
                  for row in rows]
    return DeviceTime(devices=per_device, total_s=sum(seconds for _, seconds, _ in per_device),
                      wall_s=max(row["last"] for row in rows) - min(row["first"] for row in rows))


def planned_budgets(*, experiment: Experiment) -> list[int]:
    """The device budgets `experiment`'s trials run under: its explicit one, else those their plans were made
    for (a device's "auto" budget), smallest first."""
    if experiment.memory_budget_bytes:
        return [experiment.memory_budget_bytes]
    planned = experiment.trials.exclude(plan__isnull=True).values_list("plan__budget_bytes", flat=True).distinct()
    return sorted({int(b) for b in planned if isinstance(b, int) and b > 0})


def experiment_origin(*, experiment: Experiment, trials: Sequence[TrialInfo]) -> float | None:
    """Where the devices page's time axis starts: the experiment's launch, else its trials' first unit."""
    if experiment.launched:
        return experiment.launched.timestamp()
    return (UnitSpan.objects.filter(trial_id__in=[t.id for t in trials]).order_by("start")
            .values_list("start", flat=True).first())


def device_lanes(trials: Sequence[TrialInfo]) -> dict[tuple[str, str], str]:
    """A lane name per (host, device) that any of `trials` ran a unit on."""
    return _lanes(UnitSpan.objects.filter(trial_id__in=[t.id for t in trials]).values_list("host", "device")
                  .distinct())


def _lanes(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """A lane name per (host, device): the device alone when every device is on one host."""
    pairs = sorted(set(pairs))
    one_host = len({host for host, _ in pairs}) <= 1
    return {(host, device): device if one_host else f"{host}/{device}" for host, device in pairs}


def run_windows(trials: Sequence[TrialInfo]) -> list[tuple[float, float | None]]:
    """The times any of `trials` ran, merged and in order: ``(start, end)``, end None while one still runs.

    A trial runs from its first unit span (planning comes before the scheduler calls it running) or its
    start, whichever is earlier, until it finished; one that has neither span nor start has not run.
    """
    firsts = dict(UnitSpan.objects.filter(trial_id__in=[t.id for t in trials]).values("trial_id")
                  .annotate(first=Min("start")).values_list("trial_id", "first"))
    windows: list[tuple[float, float | None]] = []
    for trial in trials:
        begins = [b for b in (trial.started, firsts.get(trial.id)) if b is not None]
        if begins:
            windows.append((min(begins), trial.finished))
    merged: list[tuple[float, float | None]] = []
    for start, end in sorted(windows, key=lambda w: w[0]):
        if merged and (merged[-1][1] is None or start <= merged[-1][1]):
            first, last = merged[-1]
            merged[-1] = (first, None if last is None or end is None else max(last, end))
        else:
            merged.append((start, end))
    return merged


def _samples(lanes: dict[tuple[str, str], str], since: float,
             windows: Sequence[tuple[float, float | None]]) -> dict[str, SampleSeries]:
    if not lanes or not windows:
        return {}
    rows = sample_rows(lanes, since, windows).values_list("host", "device", "time", "utilization", "memory_used",
                                                          "memory_total")
    raw: dict[str, SampleSeries] = defaultdict(SampleSeries)
    for host, device, time, utilization, used, total in rows:
        series = raw[lanes[(host, device)]]
        series.time.append(time)
        series.utilization.append(utilization)
        series.memory_used.append(used)
        series.memory_total = total
    thinned: dict[str, SampleSeries] = {}
    for lane, series in sorted(raw.items()):
        keep = sample_thin(series.time, series.utilization, series.memory_used, windows)
        thinned[lane] = SampleSeries(time=[series.time[i] for i in keep],
                                     utilization=[series.utilization[i] for i in keep],
                                     memory_used=[series.memory_used[i] for i in keep],
                                     memory_total=series.memory_total)
    return thinned


def sample_rows(lanes: Iterable[tuple[str, str]], since: float,
                windows: Sequence[tuple[float, float | None]]) -> QuerySet[DeviceSample]:
    """The samples the devices page draws from: of the `lanes`' devices, after `since`, inside `windows`, in
    time order (ties by id, so that every read orders them alike)."""
    where = Q(pk__in=[])
    for host, device in lanes:
        where |= Q(host=host, device=device)
    during = Q(pk__in=[])
    for start, end in windows:
        during |= Q(time__gte=start) if end is None else Q(time__gte=start, time__lte=end)
    return DeviceSample.objects.filter(where, during, time__gt=since).order_by("time", "pk")


def sample_thin(times: Sequence[float], utilization: Sequence[float], memory_used: Sequence[float],
                windows: Sequence[tuple[float, float | None]]) -> list[int]:
    """Indices of one device's samples (inside `windows`, in time order) that the page draws: the first, the
    last, and the lowest and highest utilization and memory of each time bucket (`sample_buckets`), so that
    no peak is lost. The buckets depend on the windows only, so that once an experiment has ended the same
    samples are drawn whatever others are removed (`downsample.minmax`)."""
    return minmax(sample_buckets(times, windows), utilization, memory_used)


def sample_buckets(times: Sequence[float], windows: Sequence[tuple[float, float | None]]) -> list[tuple[int, int]]:
    """Per time, its bucket: the windows' running time is cut into `SAMPLE_BUCKETS` buckets of one width,
    numbered from each window's start. A window still open ends at the last of `times`."""
    if not times:
        return []
    starts = [start for start, _ in windows]
    running = sum((times[-1] if end is None else end) - start for start, end in windows)
    width = running / SAMPLE_BUCKETS if running > 0 else 1.0
    buckets: list[tuple[int, int]] = []
    for time in times:
        window = max(bisect_right(starts, time) - 1, 0)
        buckets.append((window, int((time - starts[window]) // width)))
    return buckets
