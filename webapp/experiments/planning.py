"""From a validated experiment definition to its trials: parameters, lengths, memory plans, engine specs
(the typed `TrialSpec` that crosses to the workers).

Pure apart from reading settings for paths and the dataset's figures and example lengths
(`webapp.experiments.trial_data`): the form builds an `ExperimentDraft`, `plan_trials` checks it against the
dataset and the memory budget and returns `TrialDraft`s for the preview and for creation. A text corpus trains
as token blocks, instruction data as examples (`EXAMPLE_PARAMETERS` lay them out and pick the tokens trained).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from webapp.config import Caps
from webapp.datasets.models import Dataset
from webapp.experiments.memory_preview import FitError, memory_plan
from webapp.experiments.model_shapes import FAMILY_LABELS, ModelChoiceError, ModelShape
from webapp.experiments.objective import DPO, SFT, check_objective, dpo_spec
from webapp.experiments.search_space import (
    PARAMETERS,
    Dimension,
    SearchSpace,
    SearchSpaceError,
    Value,
    parse_search_space,
)
from webapp.experiments.trial_data import (
    EpochSize,
    TrialData,
    TrialDataError,
    check_ids,
    epoch_size,
    example_rows,
)
from webapp.experiments.trial_generation import TPE_FIRST_WAVE, initial_trials
from webapp.worker_door import DataSpec, LoraSpec, ModelSpec, OptimizerSpec, ScheduleSpec, SpecError, TrialSpec

# Batches of `batch_size` rows that a trial's regular evaluations read: micro-batch by micro-batch, so that every
# trial of an experiment, however its batch is cut, is evaluated on the same validation rows.
EVAL_BATCHES = 2
MEMORY_PARAMETERS = ("batch_size", "micro_batches", "seq_len", "n_embd", "n_layer", "optimizer")
EXAMPLE_PARAMETERS = ("packing", "loss_on")  # how examples are laid out and trained: instruction data only
LORA_NEEDS_A_CHECKPOINT = ("lora_r: LoRA trains adapters on a pretrained checkpoint; choose one from the catalog, "
                           "or set lora_r to 0 to train every weight")


class CapError(ValueError):
    """A draft that asks for more than `Caps` allows; ``field`` is the form field to change."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


PLAN_ERRORS = (SearchSpaceError, ModelChoiceError, FitError, CapError)


@dataclass(frozen=True, kw_only=True)
class ExperimentDraft:
    """An experiment as the form understood it, before anything is saved."""

    name: str
    dataset: Dataset
    model: dict[str, Any]
    shape: ModelShape
    space: SearchSpace
    strategy: str
    n_trials: int
    budget_unit: str
    budget: float
    eval_every: int
    seed: int
    memory_budget_bytes: int | None
    early_stop_patience: int | None = None
    checkpoint_minutes: int = 30  # durable checkpoints of each trial (0: none)
    priority: str = "normal"  # among the team's trials on the devices
    pruner: dict[str, Any] | None = None  # `webapp.experiments.pruning.pruner_spec`; None: no pruning
    holdout_bytes: int | None = None  # the final evaluation covers this much of the validation text; None: all
    chat_template: str = ""  # instruction data on a pretrained model: renders its conversations; "": the model's
    max_devices_per_trial: int | None = None  # a trial's micro-batches on at most this many devices; None: all
    objective: str = SFT  # `webapp.experiments.objective`: sft, or dpo on a preference dataset

    def to_dict(self) -> dict[str, Any]:
        """The draft as JSON-able data, the dataset by id (`from_dict` reads it back)."""
        return {
            "name": self.name, "dataset": self.dataset.pk, "model": self.model, "shape": dataclasses.asdict(self.shape),
            "space": self.space.to_dict(), "strategy": self.strategy, "n_trials": self.n_trials,
            "budget_unit": self.budget_unit, "budget": self.budget, "eval_every": self.eval_every, "seed": self.seed,
            "memory_budget_bytes": self.memory_budget_bytes, "early_stop_patience": self.early_stop_patience,
            "checkpoint_minutes": self.checkpoint_minutes, "priority": self.priority, "pruner": self.pruner,
            "holdout_bytes": self.holdout_bytes, "chat_template": self.chat_template,
            "max_devices_per_trial": self.max_devices_per_trial, "objective": self.objective,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, dataset: Dataset) -> ExperimentDraft:
        """The draft `to_dict` wrote, on `dataset` (the one its ``dataset`` id names)."""
        return cls(**{**data, "dataset": dataset, "shape": ModelShape(**data["shape"]),
                      "space": parse_search_space(data["space"])})


@dataclass(frozen=True, kw_only=True)
class TrialDraft:
    number: int
    params: dict[str, Value]
    total_steps: int
    plan: dict[str, Any] = field(repr=False)


def hyperparameters(params: dict[str, Value], shape: ModelShape) -> dict[str, Value]:
    """Every hyperparameter of a trial: its searched values over the defaults (width and depth: the model's)."""
    values: dict[str, Value] = {name: p.default for name, p in PARAMETERS.items()}
    values["n_embd"], values["n_layer"] = shape.n_embd, shape.n_layer
    values.update(params)
    return values


# Past 2**53 a float counts steps inexactly, and an infinite count has no integer: an absurd budget counts as this
# many steps, far over any cap, which refuses it.
MOST_STEPS = float(2**53)


def total_steps(*, budget_unit: str, budget: float, batch_size: int, seq_len: int, epoch: EpochSize) -> int:
    """Optimizer steps of a trial: the budget itself, or epochs over the training split (at least 1): its tokens
    in blocks of `seq_len`, or its examples one a row (an estimate under packing: see `EpochSize.rows`)."""
    if budget_unit == "steps":
        return max(1, int(min(budget, MOST_STEPS)))
    if epoch.examples is None:
        steps = budget * epoch.tokens / (batch_size * seq_len)
    else:
        steps = budget * epoch.rows(seq_len) / batch_size
    return max(1, math.ceil(min(steps, MOST_STEPS)))


def steps_cap_error(*, steps: int, caps: Caps) -> CapError:
    """The one refusal of a trial longer than the steps cap, quoting its steps."""
    return CapError(
        f"A trial would take {steps:,} optimizer steps; the cap is "
        f"{caps.steps_per_trial:,} per trial (HYDRA_MAX_STEPS_PER_TRIAL). Lower the budget.", field="budget",
    )


def check_steps_budget(*, budget: float, caps: Caps) -> None:
    """Raise CapError for a budget in steps over the steps cap: it needs neither the dataset nor the search
    space, so the form checks it with the fields, before the draft (`check_caps` checks epochs)."""
    steps = total_steps(budget_unit="steps", budget=budget, batch_size=1, seq_len=1, epoch=EpochSize())
    if steps > caps.steps_per_trial:
        raise steps_cap_error(steps=steps, caps=caps)


def check_trial_caps(*, steps: int, batch_size: int, seq_len: int, caps: Caps) -> None:
    """Raise CapError when one trial of `steps` steps of `batch_size` x `seq_len` tokens is over a cap."""
    if steps > caps.steps_per_trial:
        raise steps_cap_error(steps=steps, caps=caps)
    tokens = steps * batch_size * seq_len
    if tokens > caps.tokens_per_trial:
        raise CapError(
            f"A trial would train on {tokens:,} tokens ({steps:,} steps x batch {batch_size} x sequence "
            f"{seq_len}); the cap is {caps.tokens_per_trial:,} per trial (HYDRA_MAX_TOKENS_PER_TRIAL). Lower the "
            "budget, the batch size or the sequence length.", field="budget",
        )


def check_caps(draft: ExperimentDraft, *, caps: Caps) -> None:
    """Raise CapError when some trial the draft may start is over a cap, or there are too many trials.

    Steps and tokens are monotonic in batch size and sequence length, so the corners of their ranges bound
    every trial, whichever the strategy draws; this is what the form checks before anything is planned.
    """
    count = draft.space.grid_size() if draft.strategy == "grid" else draft.n_trials
    if count > caps.trials_per_experiment:
        raise CapError(
            f"The experiment would have {count} trials; the cap is {caps.trials_per_experiment} "
            "(HYDRA_MAX_TRIALS_PER_EXPERIMENT).", field="n_trials" if draft.strategy != "grid" else "strategy",
        )
    epoch = epoch_size(shape=draft.shape, dataset=draft.dataset, chat_template=draft.chat_template)
    for batch_size in _int_bounds(draft.space, "batch_size"):
        for seq_len in _int_bounds(draft.space, "seq_len"):
            steps = total_steps(budget_unit=draft.budget_unit, budget=draft.budget, batch_size=batch_size,
                                seq_len=seq_len, epoch=epoch)
            check_trial_caps(steps=steps, batch_size=batch_size, seq_len=seq_len, caps=caps)


def _int_bounds(space: SearchSpace, name: str) -> list[int]:
    """The smallest and largest value of an integer parameter (its default when it is not searched)."""
    dimension = space.get(name)
    if dimension is None:
        return [int(PARAMETERS[name].default)]
    low = min(dimension.values) if dimension.kind == "categorical" else dimension.low
    return [int(low), int(dimension.largest())]  # type: ignore[arg-type]


def initial_trial_count(draft: ExperimentDraft) -> int:
    """How many trials the draft starts with: the grid's size, the random count, or TPE's first wave."""
    if draft.strategy == "grid":
        return draft.space.grid_size()
    return min(draft.n_trials, TPE_FIRST_WAVE) if draft.strategy == "tpe" else draft.n_trials


def plan_cost(draft: ExperimentDraft) -> int:
    """The work of planning the draft's trials, in layer plans: its trials times the layers of the deepest
    (blocks, embedding and head). Each trial is packed by the solver, whose work grows with its layers."""
    depth = draft.space.get("n_layer")
    blocks = int(depth.largest()) if depth is not None else draft.shape.n_layer  # type: ignore[arg-type]
    return initial_trial_count(draft) * (blocks + 2)


def check_space(draft: ExperimentDraft) -> None:
    """Rules that tie the search space to the model and the dataset; raises SearchSpaceError/ModelChoiceError."""
    space, shape = draft.space, draft.shape
    if not draft.dataset.is_ready:
        raise ModelChoiceError(f"The dataset {draft.dataset.name} is not ready "
                               f"({draft.dataset.get_status_display().lower()}); choose a ready one.", field="dataset")
    for name in ("n_embd", "n_layer"):
        if space.get(name) and shape.pretrained_dir:
            raise SearchSpaceError(f"{name}: a pretrained model's shape is fixed; remove this row.",
                                   parameter=name, field="name")
    width = space.get("n_embd")
    if width is not None:
        widths = width.grid_values() if width.kind == "categorical" else [width.low or 0, width.step or shape.n_head]
        bad = [w for w in widths if int(w) % shape.n_head]
        if bad:
            raise SearchSpaceError(
                f"n_embd: {', '.join(str(int(w)) for w in bad)} does not split into {shape.n_head} heads; use "
                f"multiples of {shape.n_head} (for a range: low and step).", parameter="n_embd", field="values",
            )
    check_micro_batches(space)
    check_objective(objective=draft.objective, dataset=draft.dataset, shape=shape, space=space, pruner=draft.pruner)
    check_lora(space, shape)
    seq = space.get("seq_len")
    longest = int(seq.largest()) if seq else int(PARAMETERS["seq_len"].default)
    if longest > shape.n_positions:
        whose = f": the context length of {shape.model_name}" if shape.pretrained_dir and shape.model_name else ""
        raise SearchSpaceError(
            f"seq_len: {longest} is longer than the model's context ({shape.n_positions} positions{whose}).",
            parameter="seq_len" if seq else None, field="values" if seq else None,
        )
    if draft.dataset.is_instruction:
        check_examples_fit(draft)
    else:
        check_corpus_parameters(space, draft.dataset)
        if draft.dataset.n_tokens // longest < 2:
            raise ModelChoiceError(
                f"The dataset has {draft.dataset.n_tokens} tokens: too few for two blocks of {longest} (one to "
                "train on, one to validate). Use a larger corpus or a shorter sequence length.", field="dataset",
            )
    check_ids(shape=shape, dataset=draft.dataset, chat_template=draft.chat_template,
              field="checkpoint" if draft.model.get("kind") == "checkpoint" else "pretrained_dir")


def check_corpus_parameters(space: SearchSpace, dataset: Dataset) -> None:
    """A text corpus trains as token blocks: `EXAMPLE_PARAMETERS` other than their defaults are refused."""
    for name in EXAMPLE_PARAMETERS:
        dimension = space.get(name)
        if dimension is not None and any(value != PARAMETERS[name].default for value in dimension.values):
            raise SearchSpaceError(
                f"{name}: packing and loss_on apply to instruction and chat datasets; {dataset.name} is a text "
                "corpus, trained as token blocks. Remove this row.", parameter=name, field="values")


def check_examples_fit(draft: ExperimentDraft) -> None:
    """The shortest sequence the space may draw keeps some training and some validation examples of a model
    from scratch (its trials train on the dataset's own examples, whose lengths are known; a pretrained
    model's are counted once its tokenizer has made them, when its trials are sent)."""
    if draft.shape.pretrained_dir is not None:
        return
    seq = draft.space.get("seq_len")
    shortest = _int_bounds(draft.space, "seq_len")[0]
    try:
        example_rows(examples_dir=draft.dataset.examples_dir, train_examples=draft.dataset.train_examples,
                     seq_len=shortest, pairs=draft.dataset.is_preference)
    except TrialDataError as error:
        raise SearchSpaceError(f"seq_len: {error}", parameter="seq_len" if seq else None,
                               field="values" if seq else None) from None


def check_lora(space: SearchSpace, shape: ModelShape) -> None:
    """A space that may draw LoRA trials (``lora_r`` above 0) is on a pretrained model, and targets only
    modules that model has (peft would refuse the others when the trial starts); a base kept in a low
    precision draws LoRA trials only (a full fine-tune trains fp32 weights)."""
    rank = space.get("lora_r")
    smallest = None if rank is None else min(rank.values) if rank.kind == "categorical" else rank.low
    if shape.base_dtype != "fp32" and (smallest is None or float(smallest) <= 0):
        raise SearchSpaceError(
            f"lora_r: the base is kept in {shape.base_dtype}, which only a LoRA trial's frozen base can be; a full "
            "fine-tune (lora_r 0) trains fp32 weights. Give lora_r values above 0, or choose base_dtype fp32.",
            parameter="lora_r" if rank is not None else None, field="values" if rank is not None else None)
    if rank is None or rank.largest() <= 0:  # type: ignore[operator]
        return
    if not shape.pretrained_dir:
        raise SearchSpaceError(LORA_NEEDS_A_CHECKPOINT, parameter="lora_r", field="values")
    known = shape.architecture().lora_targets()
    targets = space.get("lora_targets")
    for choice in targets.values if targets is not None else (PARAMETERS["lora_targets"].default,):
        unknown = [name for name in str(choice).split(",") if name not in known]
        if unknown:
            where = "" if targets is not None else " (the default; add a lora_targets row)"
            raise SearchSpaceError(
                f"lora_targets: {', '.join(unknown)}{where} is not a linear module of a "
                f"{FAMILY_LABELS.get(shape.family, shape.family)} model; its modules are {', '.join(known)}.",
                parameter="lora_targets" if targets is not None else "lora_r",
                field="values")


def check_micro_batches(space: SearchSpace) -> None:
    """Every batch size the space may draw splits into every number of micro-batches it may draw."""
    micro = space.get("micro_batches")
    if micro is None:
        return
    batch = space.get("batch_size")
    if micro.kind != "categorical" or (batch is not None and batch.kind != "categorical"):
        raise SearchSpaceError(
            "micro_batches: list the micro-batches and the batch sizes as values (categorical), so that each batch "
            "size is known to split into each number of micro-batches.", parameter="micro_batches", field="kind")
    sizes = batch.values if batch is not None else (PARAMETERS["batch_size"].default,)
    for size in sizes:
        for count in micro.values:
            if int(size) % int(count):
                raise SearchSpaceError(
                    f"micro_batches: {int(count)} does not divide the batch size {int(size)}; a step splits its "
                    "batch into equal micro-batches.", parameter="micro_batches", field="values")


def trial_plan(params: dict[str, Value], *, shape: ModelShape, vocab_size: int, budget_bytes: int,
               dpo_pairs: int | None = None) -> dict[str, Any]:
    """The estimated memory plan of one trial (a LoRA trial's when its ``lora_r`` is above 0; a DPO trial's with
    its reference's costs when `dpo_pairs`, its dataset's pairs, is given); a unit holds one micro-batch's
    activations."""
    values = hyperparameters(params, shape)
    return memory_plan(
        shape.with_params(values, vocab_size=vocab_size),
        batch=max(1, int(values["batch_size"]) // int(values["micro_batches"])),
        seq_len=int(values["seq_len"]), optimizer=str(values["optimizer"]), momentum=float(values["momentum"]),
        budget_bytes=budget_bytes, lora=lora_spec(values), dpo_pairs=dpo_pairs,
    )


def lora_spec(values: dict[str, Value]) -> LoraSpec | None:
    """The LoRA adapters a trial's hyperparameters ask for, or None (``lora_r`` 0: every weight trains)."""
    if int(values["lora_r"]) <= 0:
        return None
    return LoraSpec(r=int(values["lora_r"]), alpha=float(values["lora_alpha"]), dropout=float(values["lora_dropout"]),
                    target_modules=tuple(str(values["lora_targets"]).split(",")))


def worst_case_params(space: SearchSpace) -> list[dict[str, Value]]:
    """The searched values that need the most memory (memory grows with each of them).

    Full training needs more than any LoRA trial of the same model, so a space that may draw ``lora_r`` 0
    is checked with it; one that draws only LoRA trials is checked with its largest rank and dropout, once
    per choice of target modules (which set needs more depends on the model's shapes)."""
    worst: dict[str, Value] = {}
    for name in MEMORY_PARAMETERS:
        dimension = space.get(name)
        if dimension is None:
            continue
        if name == "optimizer":
            worst[name] = "adamw" if "adamw" in dimension.values else dimension.values[0]
        elif name == "micro_batches":  # fewer micro-batches hold more activations at once
            worst[name] = min(dimension.values) if dimension.kind == "categorical" else int(dimension.low or 1)
        else:
            worst[name] = dimension.largest()
    rank = space.get("lora_r")
    if rank is None or _smallest(rank) <= 0:
        return [worst | ({"lora_r": 0} if rank is not None else {})]
    worst["lora_r"] = rank.largest()
    dropout = space.get("lora_dropout")
    if dropout is not None:
        worst["lora_dropout"] = dropout.largest()
    targets = space.get("lora_targets")
    if targets is None:
        return [worst]
    return [worst | {"lora_targets": choice} for choice in targets.values]


def _smallest(dimension: Dimension) -> float:
    return min(dimension.values) if dimension.kind == "categorical" else dimension.low  # type: ignore[return-value,type-var]


def plan_trials(draft: ExperimentDraft, *, budget_bytes: int, caps: Caps) -> list[TrialDraft]:
    """The experiment's initial trials with their lengths and estimated memory plans.

    Raises SearchSpaceError, ModelChoiceError, FitError (a layer that cannot fit: for random search and
    TPE the worst corner of the space is checked, since not every trial is known before launch) or
    CapError (more steps, tokens or trials than `caps` allow).
    """
    check_space(draft)
    check_caps(draft, caps=caps)
    vocab = draft.dataset.vocab_size
    pairs = draft.dataset.n_examples if draft.objective == DPO else None
    epoch = epoch_size(shape=draft.shape, dataset=draft.dataset, chat_template=draft.chat_template)
    if draft.strategy != "grid":
        for worst in worst_case_params(draft.space):
            trial_plan(worst, shape=draft.shape, vocab_size=vocab, budget_bytes=budget_bytes, dpo_pairs=pairs)
    drafts = []
    for number, params in enumerate(
        initial_trials(draft.space, strategy=draft.strategy, n_trials=draft.n_trials, seed=draft.seed),  # type: ignore[arg-type]
        start=1,
    ):
        values = hyperparameters(params, draft.shape)
        batch_size, seq_len = int(values["batch_size"]), int(values["seq_len"])
        steps = total_steps(budget_unit=draft.budget_unit, budget=draft.budget, batch_size=batch_size,
                            seq_len=seq_len, epoch=epoch)
        check_trial_caps(steps=steps, batch_size=batch_size, seq_len=seq_len, caps=caps)
        drafts.append(TrialDraft(
            number=number, params=params, total_steps=steps,
            plan=trial_plan(params, shape=draft.shape, vocab_size=vocab, budget_bytes=budget_bytes, dpo_pairs=pairs),
        ))
    return drafts


def trial_spec(*, params: dict[str, Value], shape: ModelShape, dataset: Dataset, data: TrialData, steps: int,
               eval_every: int, seed: int, budget_bytes: int, early_stop_patience: int | None = None,
               objective: str = SFT) -> TrialSpec:
    """The engine's ``TrialSpec`` of one trial, on the token blocks, examples or preference pairs, and the
    tokenizer, of `data` (with objective dpo: DPO's settings, on pairs). Raises SpecError for values the engine
    cannot train with, TrialDataError for a sequence length that drops every example of a split."""
    values = hyperparameters(params, shape)
    trial_shape = shape.with_params(values, vocab_size=dataset.vocab_size)
    lora = lora_spec(values)
    if lora is not None and trial_shape.pretrained_dir is None:
        raise SpecError(LORA_NEEDS_A_CHECKPOINT)
    return TrialSpec(
        lora=lora,
        dpo=dpo_spec(values, objective=objective),
        model=ModelSpec(
            family=trial_shape.family,  # type: ignore[arg-type]
            n_layer=trial_shape.n_layer, n_embd=trial_shape.n_embd, n_head=trial_shape.n_head,
            n_kv_head=trial_shape.n_kv_head, n_inner=trial_shape.n_inner,
            tie_word_embeddings=trial_shape.tie_word_embeddings,
            vocab_size=trial_shape.vocab_size, n_positions=trial_shape.n_positions,
            dropout=float(values["dropout"]), pretrained_dir=trial_shape.pretrained_dir,
            base_dtype=trial_shape.base_dtype,  # type: ignore[arg-type]
        ),
        data=_data_spec(values, dataset=dataset, data=data),
        optimizer=OptimizerSpec(
            kind=str(values["optimizer"]), lr=float(values["lr"]), betas=(0.9, 0.999), eps=1e-8,  # type: ignore[arg-type]
            weight_decay=float(values["weight_decay"]), momentum=float(values["momentum"]),
            clip_norm=float(values["clip_norm"]),
        ),
        schedule=ScheduleSpec(warmup_steps=int(values["warmup_steps"]), decay=str(values["lr_decay"])),  # type: ignore[arg-type]
        batch_size=int(values["batch_size"]),
        micro_batches=int(values["micro_batches"]),
        steps=steps,
        eval_every=eval_every,
        eval_batches=EVAL_BATCHES * int(values["micro_batches"]),
        seed=seed,
        budget_bytes=budget_bytes,
        bf16=values["precision"] == "bf16",
        early_stop_patience=early_stop_patience,
    )


def _data_spec(values: dict[str, Value], *, dataset: Dataset, data: TrialData) -> DataSpec:
    """A trial's token blocks, or its examples (or preference pairs) with their layout, loss and held-out rows
    (None until a pretrained tokenizer has made them: the send completes them, `trial_data.sent_data_fields`)."""
    seq_len = int(values["seq_len"])
    if data.examples_dir is not None:
        return DataSpec(examples_dir=str(data.examples_dir), train_examples=data.train_examples, seq_len=seq_len,
                        packing=bool(values["packing"]),
                        loss_on="assistant" if data.pairs else str(values["loss_on"]),  # type: ignore[arg-type]
                        holdout_rows=data.holdout_rows(seq_len), chat_template=data.chat_template,
                        tokenizer_dir=str(data.tokenizer_dir), pairs=data.pairs)
    assert data.tokens_path is not None, "a pretrained model's examples are asked for before its trials' specs"
    return DataSpec(tokens_path=str(data.tokens_path), seq_len=seq_len, val_fraction=dataset.val_fraction,
                    tokenizer_dir=str(data.tokenizer_dir))
