"""A trial's small state between units, typed, and the one definition of how the manifest holds it.

The spill store's manifest is JSON: the store's own keys (:data:`worker.engine.spill_store.STORE_KEYS`:
format, commit version, buffer versions, fencing token) plus the trial's, which only this module reads
or writes. :meth:`TrialState.from_manifest` of :meth:`TrialState.to_manifest` gives back an equal state
(through ``json`` too), and a manifest that lacks a trial key, or has one this module does not know, is
refused with a ``SpillStoreError`` naming the key, rather than read as something it is not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from worker.engine.config import TrialSpec
from worker.engine.errors import SpillStoreError
from worker.engine.partition import MemoryPlan
from worker.engine.schedule import Timetable
from worker.engine.spill_store import STORE_KEYS, SpillStore

GradState = Literal["empty", "partial"]


@dataclass
class ShardState:
    """One shard between units.

    ``grad``: whether its ``g`` buffer holds gradients of the step in flight ("partial": micro-batches
    accumulated so far) or nothing to read ("empty"). ``pending``: the last completed step's update is
    still to be applied to it (it is applied when the shard is next loaded). ``optim_steps``: updates
    applied so far (AdamW's step count; SGD has momentum from its first update on).
    """

    pending: bool = False
    grad: GradState = "empty"
    optim_steps: int = 0


@dataclass(frozen=True)
class PendingStep:
    """The completed step whose update the shards marked ``pending`` still have to apply."""

    step: int
    total_norm: float  # global gradient norm of the step, for clipping


@dataclass
class StepState:
    """Running sums of the step in flight: the micro-batches' losses (each its part of the step's mean token
    loss), and per shard the norms of its
    parameters' accumulated gradients (set when the shard's backward of the last micro-batch ran). A DPO step
    also sums its micro-batches' parts of the mean implicit rewards of the chosen and rejected answers and of
    the share of pairs whose chosen reward is the higher. ``parked``: by micro-batch, the loss (and a DPO step's
    reward parts, in ``REWARDS`` order) of the micro-batches of a gathered step (see
    :class:`~worker.engine.schedule.Segment`) whose gradients wait in their ``h`` buffers to be added to the sum in
    micro-batch order."""

    loss_sum: float = 0.0
    norms: dict[int, list[float]] = field(default_factory=dict)
    parked: dict[int, list[float]] = field(default_factory=dict)
    chosen_reward: float = 0.0
    rejected_reward: float = 0.0
    reward_accuracy: float = 0.0

    REWARDS = ("chosen_reward", "rejected_reward", "reward_accuracy")

    def add(self, row: Sequence[float]) -> None:
        """Add one micro-batch's loss, then its reward parts (a DPO step's, in ``REWARDS`` order), to the sums."""
        self.loss_sum += row[0]
        for name, value in zip(self.REWARDS, row[1:], strict=False):
            setattr(self, name, getattr(self, name) + value)


@dataclass
class EvalState:
    """Running sums of the evaluation in flight, over the validation batches done so far: their summed token
    losses (nats), the tokens they predicted and those tokens' UTF-8 bytes (a DPO evaluation's: its chosen
    answers'); and a DPO evaluation's pairs, their summed losses, chosen and rejected rewards, and how many had
    the chosen reward above the rejected one. ``parked``: by batch, the sums (``SUMS``, a DPO evaluation's
    ``PAIR_SUMS``) of each batch of a gathered evaluation (see :class:`~worker.engine.schedule.Segment`) that ended
    before the batches ahead of it were summed."""

    token_loss_sum: float = 0.0
    tokens: int = 0
    bytes: int = 0
    pairs: int = 0
    pair_loss_sum: float = 0.0
    chosen_reward_sum: float = 0.0
    rejected_reward_sum: float = 0.0
    accurate: int = 0
    parked: dict[int, list[float]] = field(default_factory=dict)

    SUMS = ("token_loss_sum", "tokens", "bytes")
    PAIR_SUMS = ("pairs", "pair_loss_sum", "chosen_reward_sum", "rejected_reward_sum", "accurate", *SUMS)
    COUNTS = frozenset({"tokens", "bytes", "pairs", "accurate"})

    def add(self, row: Sequence[float]) -> None:
        """Add one batch's sums to the evaluation's: a row of ``SUMS``, or of ``PAIR_SUMS`` (a DPO evaluation's)."""
        names = self.SUMS if len(row) == len(self.SUMS) else self.PAIR_SUMS
        assert len(row) == len(names), row
        for name, value in zip(names, row, strict=True):
            setattr(self, name, getattr(self, name) + (int(value) if name in self.COUNTS else value))


@dataclass
class EarlyStop:
    """The best validation loss so far and the number of evaluations since it; and, once the trial's stop
    rule ended it at an evaluation (its experiment's pruner), why."""

    best: float | None = None
    since: int = 0
    pruned: str | None = None


@dataclass(kw_only=True)
class TrialState:
    """Everything of a trial that is not a buffer: its spec and plan, which units of the timetable are
    committed (every unit before ``cursor``, and the units of ``ahead``: those a wavefront committed beyond it,
    see :class:`~worker.engine.schedule.Segment`), per-shard flags, the pending update, running sums, and how
    often it was re-planned. Edited in place during a unit; committed with the unit's buffers by the session."""

    trial_id: str
    spec: TrialSpec
    plan: MemoryPlan
    cursor: int = 0
    ahead: list[int] = field(default_factory=list)  # sorted, each > cursor; empty when units ran in order
    shards: list[ShardState]
    pending: PendingStep | None = None
    step_state: StepState = field(default_factory=StepState)
    eval_state: EvalState = field(default_factory=EvalState)
    early_stop: EarlyStop = field(default_factory=EarlyStop)
    replans: int = 0
    # The last committed unit (its index in the timetable, -1 before the first) and the metrics it reported
    # (UnitResult's loss, eval_loss...): a device that finds the unit committed by one that died before
    # reporting it reports them in its place.
    last_unit: int = -1
    last_metrics: dict[str, Any] = field(default_factory=dict)
    # A LoRA trial's shared frozen base on this host (worker.engine.shared_base key); None without LoRA.
    base: str | None = None
    # Batches of reference units that open the timetable (a DPO trial of full fine-tuning; see schedule.py).
    reference_batches: int = 0
    # A plan of one shard ends each step with an S unit (Timetable.step_units); false in a store written before.
    step_units: bool = False
    # The JSON form of ``spec`` and ``plan`` (key -> (object, its JSON)): both are frozen, and converting
    # them at every commit would cost more than the rest of the manifest.
    _json: dict[str, tuple[Any, Any]] = field(init=False, default_factory=dict, compare=False, repr=False)

    @classmethod
    def start(cls, *, trial_id: str, spec: TrialSpec, plan: MemoryPlan, base: str | None = None,
              reference_batches: int = 0) -> TrialState:
        """A trial before its first unit."""
        return cls(trial_id=trial_id, spec=spec, plan=plan, shards=[ShardState() for _ in plan.shards], base=base,
                   reference_batches=reference_batches, step_units=True)

    def timetable(self, *, spec: TrialSpec | None = None, plan: MemoryPlan | None = None) -> Timetable:
        """The trial's timetable under its plan (or of ``spec``, under ``plan``, with this trial's reference pass and
        step units)."""
        return Timetable.of(spec or self.spec, shards=len((plan or self.plan).shards),
                            reference_batches=self.reference_batches, step_units=self.step_units)

    # -- progress --------------------------------------------------------------------------------------

    def committed(self, index: int) -> bool:
        return index < self.cursor or index in self.ahead

    @property
    def units_committed(self) -> int:
        return self.cursor + len(self.ahead)

    def mark_committed(self, index: int) -> None:
        """Unit ``index`` is committed: the cursor moves past every unit committed in a row from it."""
        self.ahead = sorted({*self.ahead, index})
        _normalize(self)

    def skip_to(self, index: int) -> None:
        """Every unit before ``index`` counts as committed (an early stop skips the steps it leaves out)."""
        self.cursor = max(self.cursor, index)
        _normalize(self)

    # -- transitions -----------------------------------------------------------------------------------

    def mark_step_pending(self, step: int, total_norm: float) -> None:
        """Step ``step``'s backward is complete: every shard applies its update when next loaded."""
        self.pending = PendingStep(step, total_norm)
        for shard in self.shards:
            shard.pending = True
        self.step_state = StepState()

    def reset_step(self) -> None:
        """Forget the step in flight: its partial gradients and running sums (a shard whose update is
        still pending keeps its gradients, those of the completed step before)."""
        for shard in self.shards:
            if not shard.pending:
                shard.grad = "empty"
        self.step_state = StepState()

    def reset_eval(self) -> None:
        """Forget the evaluation in flight."""
        self.eval_state = EvalState()

    def replan(self, plan: MemoryPlan, *, cursor: int) -> None:
        """Continue under ``plan`` from timetable index ``cursor``; only between two steps, with every
        update applied (every shard then took the same number of steps, which the new shards inherit)."""
        assert all(s.grad == "empty" and not s.pending for s in self.shards), "no gradient survives a rollback"
        (optim_steps,) = {s.optim_steps for s in self.shards}  # every shard took every step
        self.plan = plan
        self.replans += 1
        self.shards = [ShardState(optim_steps=optim_steps) for _ in plan.shards]
        self.cursor, self.ahead = cursor, []
        self.last_unit, self.last_metrics = -1, {}  # an index into the old timetable means nothing now

    # -- the manifest ----------------------------------------------------------------------------------

    def to_manifest(self) -> dict[str, Any]:
        """The trial's keys of the manifest, in JSON's own types (what ``json.loads`` of it gives back)."""
        return {
            "trial_id": self.trial_id,
            "spec": self._json_of("spec", self.spec),
            "plan": self._json_of("plan", self.plan),
            "cursor": self.cursor,
            "ahead": list(self.ahead),
            "shards": [{"pending": s.pending, "grad": s.grad, "optim_steps": s.optim_steps} for s in self.shards],
            "pending": None if self.pending is None else {"step": self.pending.step,
                                                          "total_norm": self.pending.total_norm},
            "step_state": {"loss_sum": self.step_state.loss_sum,
                           "norms": {str(shard): norms for shard, norms in self.step_state.norms.items()},
                           "parked": {str(lane): list(row) for lane, row in self.step_state.parked.items()},
                           **{name: getattr(self.step_state, name) for name in StepState.REWARDS}},
            "eval_state": {**dataclasses.asdict(self.eval_state),
                           "parked": {str(batch): list(sums) for batch, sums in self.eval_state.parked.items()}},
            "early_stop": {"best": self.early_stop.best, "since": self.early_stop.since,
                           **({"pruned": self.early_stop.pruned} if self.early_stop.pruned is not None else {})},
            "replans": self.replans,
            "last_unit": self.last_unit,
            "last_metrics": self.last_metrics,
            "base": self.base,
            "reference_batches": self.reference_batches,
            "step_units": self.step_units,
        }

    def _json_of(self, key: str, value: TrialSpec | MemoryPlan) -> Any:
        cached = self._json.get(key)
        if cached is None or cached[0] is not value:
            cached = self._json[key] = (value, _json_native(value.to_dict()))
        return cached[1]

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], *, known: TrialState | None = None) -> TrialState:
        """The state in ``manifest`` (the store's keys are ignored); ``SpillStoreError`` if a trial key is
        missing or unknown. ``early_stop``, ``replans``, ``last_unit`` and ``last_metrics`` may be absent: a trial not
        evaluated, not re-planned or not run yet.

        ``known`` is an earlier state of the same trial: while no re-plan came between the two, its spec
        and plan are the manifest's (a spec never changes, a plan only with a re-plan), and they are reused
        rather than built again, which a session does before every unit.
        """
        raw = _keys(manifest, "manifest", required=_REQUIRED, optional=_OPTIONAL, ignored=STORE_KEYS)
        step_state = _keys(raw["step_state"], "step_state", required={"loss_sum", "norms"},
                           optional=frozenset({*StepState.REWARDS, "parked"}))
        early_stop = raw.get("early_stop")
        pending = raw["pending"]
        same = known is not None and known.trial_id == raw["trial_id"] and known.replans == raw.get("replans", 0)
        state = cls(
            trial_id=raw["trial_id"],
            spec=known.spec if same else TrialSpec.from_dict(raw["spec"]),  # type: ignore[union-attr]
            plan=known.plan if same else MemoryPlan.from_dict(raw["plan"]),  # type: ignore[union-attr]
            cursor=raw["cursor"],
            ahead=list(raw.get("ahead", [])),
            shards=[ShardState(**_keys(s, "shards[]", required={"pending", "grad", "optim_steps"}))
                    for s in raw["shards"]],
            pending=None if pending is None else PendingStep(
                **_keys(pending, "pending", required={"step", "total_norm"})),
            step_state=StepState(loss_sum=step_state["loss_sum"],
                                 norms={int(shard): norms for shard, norms in step_state["norms"].items()},
                                 parked={int(lane): _parked_row(row)
                                         for lane, row in step_state.get("parked", {}).items()},
                                 **{name: step_state[name] for name in StepState.REWARDS if name in step_state}),
            eval_state=_eval_state(raw["eval_state"]),
            early_stop=EarlyStop() if early_stop is None else EarlyStop(
                **_keys(early_stop, "early_stop", required={"best", "since"}, optional=frozenset({"pruned"}))),
            replans=raw.get("replans", 0),
            last_unit=raw.get("last_unit", -1),
            last_metrics=raw.get("last_metrics", {}),
            base=raw.get("base"),
            reference_batches=raw.get("reference_batches", 0),
            step_units=raw.get("step_units", False),
        )
        state._json.update(spec=(state.spec, raw["spec"]), plan=(state.plan, raw["plan"]))
        return state

    @classmethod
    def of(cls, store: SpillStore, *, known: TrialState | None = None) -> TrialState:
        """The state in ``store``'s working manifest (``known``: see :meth:`from_manifest`)."""
        return cls.from_manifest(store.manifest, known=known)

    def stage_in(self, store: SpillStore) -> None:
        """Put this state into ``store``'s working manifest, for its next commit to publish."""
        store.manifest.update(self.to_manifest())


def _parked_row(row: float | list[float]) -> list[float]:
    # A store written before DPO steps parked too holds a parked loss alone, as a number.
    return [row] if isinstance(row, int | float) else list(row)


def _eval_state(raw: dict[str, Any]) -> EvalState:
    # A store written before evaluations averaged per token also summed the batches' mean losses.
    sums = _keys(raw, "eval_state", required=set(), optional=frozenset(f.name for f in dataclasses.fields(EvalState)),
                 ignored=frozenset({"loss_sum"}))
    return EvalState(**{**sums, "parked": {int(batch): list(s) for batch, s in sums.get("parked", {}).items()}})


_REQUIRED = frozenset({"trial_id", "spec", "plan", "cursor", "shards", "pending", "step_state", "eval_state"})
_OPTIONAL = frozenset({"early_stop", "replans", "last_unit", "last_metrics", "base", "ahead", "reference_batches",
                       "step_units"})


def _normalize(state: TrialState) -> None:
    ahead = sorted(i for i in set(state.ahead) if i >= state.cursor)
    while ahead and ahead[0] == state.cursor:
        ahead.pop(0)
        state.cursor += 1
    state.ahead = ahead


class MergeConflict(SpillStoreError):
    """Two commits changed the same part of a trial's state: the later one must run its unit again."""


def merge_trial_keys(base: dict[str, Any], mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """The trial keys of a commit made from ``base`` (``mine``) onto a store that moved on to ``theirs`` since:
    units of one trial that run at once (a wavefront's lanes) each change other parts of its state, and their
    commits add up. Every unit committed in either is committed; ``last_unit`` and ``last_metrics`` are the
    later commit's (``mine``); any other value both changed is a ``MergeConflict``, and so is a re-plan in
    between (the unit ran under the old plan)."""
    if theirs.get("replans", 0) != base.get("replans", 0):
        raise MergeConflict(f"the trial was re-planned (re-plan {theirs.get('replans', 0)}) while this unit ran")
    progress = {"cursor", "ahead", "last_unit", "last_metrics"}
    merged = _merge({k: v for k, v in base.items() if k not in progress},
                    {k: v for k, v in mine.items() if k not in progress},
                    {k: v for k, v in theirs.items() if k not in progress}, "")
    cursor = max(int(mine["cursor"]), int(theirs["cursor"]))
    ahead = sorted(i for i in {*mine.get("ahead", []), *theirs.get("ahead", [])} if i >= cursor)
    while ahead and ahead[0] == cursor:
        ahead.pop(0)
        cursor += 1
    merged.update(cursor=cursor, ahead=ahead)
    for key in ("last_unit", "last_metrics"):
        if key in mine:
            merged[key] = mine[key]
    return merged


_ABSENT = object()


def _merge(base: Any, mine: Any, theirs: Any, where: str) -> Any:
    """Three-way merge of JSON values: a side that did not change takes the other's; dicts merge key by key,
    lists of one length element by element; anything else changed on both sides is a conflict."""
    if mine == base:
        return theirs
    if theirs in (base, mine):
        return mine
    if isinstance(base, dict) and isinstance(mine, dict) and isinstance(theirs, dict):
        out = {}
        for key in {*base, *mine, *theirs}:
            value = _merge(base.get(key, _ABSENT), mine.get(key, _ABSENT), theirs.get(key, _ABSENT), f"{where}.{key}")
            if value is not _ABSENT:
                out[key] = value
        return out
    if (isinstance(base, list) and isinstance(mine, list) and isinstance(theirs, list)
            and len(base) == len(mine) == len(theirs)):
        return [_merge(b, m, t, f"{where}[{i}]") for i, (b, m, t) in enumerate(zip(base, mine, theirs, strict=True))]
    raise MergeConflict(f"trial state{where} was changed by another commit while this unit ran")


def _json_native(value: Any) -> Any:
    """``value`` with its tuples as lists, as JSON reads them back."""
    if isinstance(value, dict):
        return {k: _json_native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_native(v) for v in value]
    return value


def _keys(raw: dict[str, Any], where: str, *, required: frozenset[str] | set[str],
          optional: frozenset[str] = frozenset(), ignored: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``raw`` without the ``ignored`` keys, after checking it has every ``required`` key and no other
    than ``optional`` ones."""
    keys = set(raw) - ignored
    if missing := sorted(required - keys):
        raise SpillStoreError(f"trial state: {where} lacks {', '.join(map(repr, missing))}")
    if unknown := sorted(keys - required - optional):
        raise SpillStoreError(f"trial state: {where} has unknown {', '.join(map(repr, unknown))}")
    return {k: v for k, v in raw.items() if k not in ignored}
