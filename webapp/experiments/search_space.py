"""Search spaces: typed hyperparameters, parsed from form rows or YAML/JSON, expanded to grids.

Pure (no Django). A search space is an ordered mapping ``name -> Dimension``; its serialized form, which is
also the YAML/JSON users paste and download, is::

    lr:         {kind: logfloat, low: 1.0e-4, high: 1.0e-2}
    batch_size: {kind: categorical, values: [8, 16]}
    n_layer:    {kind: int, low: 2, high: 6, step: 2}

and a bare list of values is read as a categorical one (``batch_size: [8, 16]``), a bare value as a fixed one
(``lr: 0.001``: a categorical parameter of one value).

Pasted text (`webapp.experiments.space_text`) may also name the model, beside the parameters, under the key
``model``: ``model: {preset: llama-micro}``, ``model: {checkpoint: <catalog name>}`` or a custom size such as
``model: {family: llama, n_layer: 4, n_embd: 128, n_head: 4, n_kv_head: 2, n_positions: 512}``; and how often
its trials take durable checkpoints, under ``checkpoint_minutes``; and, for instruction and chat data, the chat
template that renders its conversations, under ``chat_template``.

Instruction data adds three parameters: ``packing`` (``[true, false]``: several whole examples in a row, or
one), ``loss_on`` (which tokens the loss covers: ``assistant``, ``last`` or ``all``) and the sequence length,
which may be written ``max_seq_len`` there (`ALIASES`): on examples it is the longest one a row holds, longer
ones being dropped, never cut. It is one parameter, stored and shown as ``seq_len``.

Preference data trains with DPO (pasted text says ``objective: dpo``; `webapp.experiments.objective`), which adds
``dpo_beta`` (TRL's beta, searched on a log scale: ``{kind: logfloat, low: 0.03, high: 0.3}``) and
``dpo_loss_type`` (``sigmoid`` or ``ipo``).

Every error is a `SearchSpaceError` naming the parameter and the field, so forms can put it beside the row;
a space with several bad parameters raises them all at once (`SearchSpaceErrors`). An unknown name is
answered with the parameter it most likely means (`suggestion`). Messages quote at most `QUOTE_CHARS` of any
value.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from webapp.worker_door import DPO_LOSS_TYPES

Kind = Literal["categorical", "int", "float", "logfloat"]
KINDS: tuple[Kind, ...] = ("categorical", "int", "float", "logfloat")
GRID_CAP = 256  # most trials a grid may expand to
Value = bool | int | float | str
QUOTE_CHARS = 40  # the most of a user's value that an error message repeats
MAX_NODES = 1000  # YAML nodes in a pasted space: a dozen parameters with their ranges and values fit easily
MAX_DEPTH = 4  # space -> parameter -> field -> list of values
MODEL_KEY = "model"  # pasted text may name the experiment's model beside the parameters
PRUNER_KEY = "pruner"  # ... which pruner stops its trials that fall behind
HOLDOUT_KEY = "holdout_bytes"  # ... and how much of the validation text every trial's final evaluation covers
MAX_HOLDOUT_BYTES = 10**12
CHECKPOINT_KEY = "checkpoint_minutes"  # ... and how often its trials take durable checkpoints
DEVICES_KEY = "max_devices_per_trial"  # ... and on how many devices at most a trial's micro-batches run at once
TEMPLATE_KEY = "chat_template"  # ... and the chat template of its instruction data
OBJECTIVE_KEY = "objective"  # ... and what its trials minimize: sft (the default) or dpo


class SearchSpaceError(ValueError):
    """A bad search space. ``parameter`` and ``field`` say where (``None`` for the space as a whole)."""

    def __init__(self, message: str, *, parameter: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.field = field

    @property
    def errors(self) -> list[SearchSpaceError]:
        """Each error this one stands for: itself (`SearchSpaceErrors`: every one it gathered)."""
        return [self]


class SearchSpaceErrors(SearchSpaceError):
    """Several errors of one search space, found together; its message has each on a line of its own, and
    ``parameter`` and ``field`` are the first one's."""

    def __init__(self, errors: Sequence[SearchSpaceError]) -> None:
        super().__init__("\n".join(str(e) for e in errors), parameter=errors[0].parameter, field=errors[0].field)
        self._errors = list(errors)

    @property
    def errors(self) -> list[SearchSpaceError]:
        return self._errors


def raise_all(errors: Sequence[SearchSpaceError]) -> None:
    """Raise the one error, or every one of several together; nothing when there is none."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise SearchSpaceErrors([e for error in errors for e in error.errors])


def quote(raw: object) -> str:
    """`raw` for an error message: the repr of a scalar, cut to `QUOTE_CHARS`; only the type of anything else."""
    if not isinstance(raw, str | int | float) and raw is not None:
        return f"a {type(raw).__name__}"
    if isinstance(raw, int) and abs(raw) >= 10**QUOTE_CHARS:
        return f"a {raw.bit_length()}-bit integer"  # repr() of a long enough int even raises
    text = repr(raw)
    return text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 1] + "…"


@dataclass(frozen=True)
class ParameterDef:
    """A hyperparameter Hydra knows: its value type, the kinds it may be searched as, and its bounds."""

    name: str
    label: str
    type: type
    kinds: tuple[Kind, ...]
    default: Value
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    architecture: bool = False  # changes the model's shape: not searchable for a pretrained model


PARAMETERS: dict[str, ParameterDef] = {
    p.name: p
    for p in [
        ParameterDef("lr", "learning rate", float, ("categorical", "float", "logfloat"), 1e-3, 1e-8, 10.0),
        ParameterDef("batch_size", "batch size (sequences per step)", int, ("categorical", "int"), 8, 1, 4096),
        ParameterDef("weight_decay", "weight decay", float, ("categorical", "float", "logfloat"), 0.01, 0.0, 1.0),
        ParameterDef("warmup_steps", "warm-up steps", int, ("categorical", "int"), 0, 0, 1_000_000),
        ParameterDef("lr_decay", "learning-rate decay", str, ("categorical",), "cosine",
                     choices=("constant", "linear", "cosine")),
        ParameterDef("dropout", "dropout", float, ("categorical", "float"), 0.1, 0.0, 0.9),
        ParameterDef("optimizer", "optimizer", str, ("categorical",), "adamw", choices=("adamw", "sgd")),
        ParameterDef("momentum", "SGD momentum", float, ("categorical", "float"), 0.9, 0.0, 0.999),
        ParameterDef("clip_norm", "gradient clipping norm", float, ("categorical", "float", "logfloat"), 1.0,
                     1e-4, 1e4),
        ParameterDef("seq_len", "sequence length (tokens a row holds; on instruction data also called "
                     "max_seq_len: longer examples are dropped, never cut)", int, ("categorical", "int"), 64, 4,
                     65_536),
        ParameterDef("packing", "packing (instruction data: true puts several whole examples in a row, false one)",
                     bool, ("categorical",), False),
        ParameterDef("loss_on", "loss on (instruction data: the assistant turns, the last one, or all tokens)", str,
                     ("categorical",), "assistant", choices=("assistant", "last", "all")),
        ParameterDef("micro_batches", "micro-batches per step (gradient accumulation; each must divide the batch; "
                     "when devices would idle, a trial runs its micro-batches on as many at once)",
                     int, ("categorical", "int"), 1, 1, 4096),
        ParameterDef("precision", "precision: fp32, or bf16 autocast (GPU devices only)", str, ("categorical",),
                     "fp32", choices=("fp32", "bf16")),
        ParameterDef("lora_r", "LoRA rank (0: train every weight; above 0: LoRA adapters on a pretrained model)",
                     int, ("categorical", "int"), 0, 0, 4096),
        ParameterDef("lora_alpha", "LoRA alpha (the adapters are scaled by alpha / rank)", float,
                     ("categorical", "float", "logfloat"), 16.0, 1e-3, 1e5),
        ParameterDef("lora_dropout", "LoRA dropout (on each adapter's input)", float, ("categorical", "float"), 0.0,
                     0.0, 0.9),
        ParameterDef("lora_targets", "LoRA target modules (comma-separated, e.g. q_proj,v_proj; GPT-2: c_attn)", str,
                     ("categorical",), "q_proj,v_proj"),
        ParameterDef("dpo_beta", "DPO beta (objective dpo: how far from the reference the rewards may pull; TRL's "
                     "beta)", float, ("categorical", "float", "logfloat"), 0.1, 1e-6, 1000.0),
        ParameterDef("dpo_loss_type", "DPO loss (objective dpo: sigmoid, DPO's own; ipo, IPO's squared loss)", str,
                     ("categorical",), "sigmoid", choices=DPO_LOSS_TYPES),
        ParameterDef("n_embd", "width (embedding size)", int, ("categorical", "int"), 0, 8, 16_384,
                     architecture=True),
        ParameterDef("n_layer", "depth (transformer blocks)", int, ("categorical", "int"), 0, 1, 256,
                     architecture=True),
    ]
}
ALIASES = {"max_seq_len": "seq_len"}  # other names a parameter may be written with
# What other tools (transformers' TrainingArguments, peft's LoraConfig, nanoGPT) call Hydra's parameters, for
# "did you mean": names that look nothing alike, which a spelling match would miss.
OTHER_NAMES = {"learning_rate": "lr", "per_device_train_batch_size": "batch_size", "r": "lora_r",
               "rank": "lora_r", "target_modules": "lora_targets", "max_grad_norm": "clip_norm",
               "grad_clip": "clip_norm", "lr_scheduler_type": "lr_decay", "lr_scheduler": "lr_decay",
               "gradient_accumulation_steps": "micro_batches", "block_size": "seq_len", "max_length": "seq_len",
               "optim": "optimizer", "bf16": "precision", "fp16": "precision", "beta": "dpo_beta",
               "loss_type": "dpo_loss_type"}
FLAGS = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}  # a bool row's words


def canonical_name(name: str) -> str:
    """The parameter `name` stands for (itself unless it is one of `ALIASES`)."""
    return ALIASES.get(name, name)


def suggestion(name: str) -> str | None:
    """The parameter an unknown `name` most likely means: another tool's name for it, or the closest in
    spelling (case aside); None when nothing is close."""
    key = name.strip().lower()
    if len(key) > 64:  # no parameter's name is near this long
        return None
    if key in OTHER_NAMES:
        return OTHER_NAMES[key]
    close = difflib.get_close_matches(key, [*PARAMETERS, *ALIASES], n=1, cutoff=0.6)
    return close[0] if close else None


@dataclass(frozen=True)
class Dimension:
    """One searched parameter: ``values`` for categorical, ``low``/``high`` (and int ``step``) otherwise."""

    name: str
    kind: Kind
    values: tuple[Value, ...] = ()
    low: float | None = None
    high: float | None = None
    step: int | None = None

    def grid_values(self) -> Sequence[Value]:
        if self.kind == "categorical":
            return self.values
        if self.kind == "int":
            assert self.low is not None and self.high is not None
            return range(int(self.low), int(self.high) + 1, self.step or 1)
        raise SearchSpaceError(
            f"{self.name}: a {self.kind} range has no grid; list the values (categorical) or use random search "
            "or TPE.", parameter=self.name, field="kind",
        )

    def largest(self) -> Value:
        """The largest value this dimension can take (for worst-case memory checks)."""
        if self.kind == "categorical":
            return max(self.values, key=lambda v: (isinstance(v, str), v))
        assert self.high is not None
        if self.kind == "int":
            return self.grid_values()[-1]
        return self.high

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "categorical":
            return {"kind": self.kind, "values": list(self.values)}
        raw: dict[str, Any] = {"kind": self.kind, "low": self.low, "high": self.high}
        if self.kind == "int":
            raw["low"], raw["high"] = int(self.low or 0), int(self.high or 0)
            if self.step and self.step != 1:
                raw["step"] = self.step
        return raw


@dataclass(frozen=True)
class SearchSpace:
    dimensions: tuple[Dimension, ...]

    def __iter__(self) -> Iterator[Dimension]:
        return iter(self.dimensions)

    def __len__(self) -> int:
        return len(self.dimensions)

    def get(self, name: str) -> Dimension | None:
        return next((d for d in self.dimensions if d.name == name), None)

    def grid_size(self) -> int:
        return math.prod(len(d.grid_values()) for d in self.dimensions)

    def grid(self) -> list[dict[str, Value]]:
        """Every combination, first dimension slowest; raises SearchSpaceError above `GRID_CAP`."""
        size = self.grid_size()
        if size > GRID_CAP:
            raise SearchSpaceError(
                f"The grid has {size} points; the cap is {GRID_CAP}. Remove values or use random search or TPE.",
                field="strategy",
            )
        names = [d.name for d in self.dimensions]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(d.grid_values() for d in self))]

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {d.name: d.to_dict() for d in self.dimensions}


def _number(raw: object, *, parameter: ParameterDef, field: str) -> float:
    if isinstance(raw, bool) or raw is None or raw == "":
        raise SearchSpaceError(f"{parameter.name}: {field} is missing.", parameter=parameter.name, field=field)
    if not isinstance(raw, str | int | float):
        raise SearchSpaceError(
            f"{parameter.name}: {field} is {quote(raw)}, not a number.", parameter=parameter.name, field=field
        )
    try:
        value = float(raw)  # YAML reads 1e-4 as a string; accept it
    except OverflowError:  # an int past float's range
        value = math.inf if raw > 0 else -math.inf  # type: ignore[operator]
    except ValueError:
        raise SearchSpaceError(
            f"{parameter.name}: {field} {quote(raw)} is not a number.", parameter=parameter.name, field=field
        ) from None
    if not math.isfinite(value):
        raise SearchSpaceError(f"{parameter.name}: {field} must be finite.", parameter=parameter.name, field=field)
    if parameter.type is int and value != int(value):
        raise SearchSpaceError(
            f"{parameter.name}: {field} {quote(raw)} is not a whole number.", parameter=parameter.name, field=field
        )
    lo, hi = parameter.minimum, parameter.maximum
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise SearchSpaceError(
            f"{parameter.name}: {field} {value:g} is outside [{lo:g}, {hi:g}].", parameter=parameter.name, field=field
        )
    return int(value) if parameter.type is int else value


MODULE_LIST = re.compile(r"[a-z_][a-z0-9_]*(,[a-z_][a-z0-9_]*)*")


def _flag(raw: object, parameter: ParameterDef) -> bool:
    """A bool parameter's value: YAML's true/false, or a form row's word for one (`FLAGS`)."""
    if isinstance(raw, bool):
        return raw
    flag = FLAGS.get(raw.strip().lower()) if isinstance(raw, str) else None
    if flag is None:
        raise SearchSpaceError(f"{parameter.name}: {quote(raw)} is not true or false.", parameter=parameter.name,
                               field="values")
    return flag


def _value(raw: object, parameter: ParameterDef) -> Value:
    if parameter.type is bool:
        return _flag(raw, parameter)
    if parameter.type is str and not parameter.choices:  # a list of module names
        text = raw.replace(" ", "").lower() if isinstance(raw, str) else ""
        if not MODULE_LIST.fullmatch(text):
            raise SearchSpaceError(
                f"{parameter.name}: {quote(raw)} is not a comma-separated list of module names such as q_proj,v_proj.",
                parameter=parameter.name, field="values",
            )
        return text
    if parameter.type is str:
        text = raw.strip().lower() if isinstance(raw, str) else None
        if text not in parameter.choices:
            raise SearchSpaceError(
                f"{parameter.name}: {quote(raw)} is not one of {', '.join(parameter.choices)}.",
                parameter=parameter.name, field="values",
            )
        return text
    return _number(raw, parameter=parameter, field="values")


def parse_dimension(name: str, raw: Mapping[str, Any] | list[Any]) -> Dimension:
    """One parameter from its serialized form (`name` may be an alias: the dimension has the parameter's own
    name); raises SearchSpaceError naming the parameter and field."""
    parameter = PARAMETERS.get(canonical_name(name))
    if parameter is None:
        likely = suggestion(name)
        aliases = ", ".join(f"{alias} (another name of {target})" for alias, target in ALIASES.items())
        raise SearchSpaceError(
            f"Unknown parameter {quote(name)}{f'; did you mean {likely}?' if likely else '.'} Hydra searches "
            f"{', '.join(PARAMETERS)} and {aliases}.", parameter=name, field="name"
        )
    if isinstance(raw, list):  # a bare list of values: ``packing: [true, false]``
        raw = {"kind": "categorical", "values": raw}
    elif isinstance(raw, bool | int | float | str):  # a bare value: ``lr: 0.001``, fixed for every trial
        raw = {"kind": "categorical", "values": [raw]}
    if not isinstance(raw, Mapping):
        raise SearchSpaceError(f"{name}: give a value, a list of values, or a mapping with kind and values or "
                               "low/high.", parameter=name)
    unknown = sorted(quote(str(key)) for key in set(raw) - {"kind", "values", "low", "high", "step"})
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise SearchSpaceError(f"{name}: unknown field(s) {shown}.", parameter=name)
    kind = raw.get("kind", "categorical" if "values" in raw else None)
    if not isinstance(kind, str | None) or kind not in parameter.kinds:
        raise SearchSpaceError(
            f"{name}: kind {quote(kind)} is not allowed; use {' or '.join(parameter.kinds)}.", parameter=name,
            field="kind",
        )
    if kind == "categorical":
        values = raw.get("values")
        if isinstance(values, str | int | float):
            values = [values]
        if not values:
            raise SearchSpaceError(f"{name}: list at least one value.", parameter=name, field="values")
        if not isinstance(values, list | tuple):
            raise SearchSpaceError(f"{name}: values is {quote(values)}; give a list.", parameter=name,
                                   field="values")
        parsed = tuple(dict.fromkeys(_value(v, parameter) for v in values))  # drop duplicates, keep order
        return Dimension(parameter.name, kind, values=parsed)
    if raw.get("values"):
        raise SearchSpaceError(f"{name}: a {kind} range takes low and high, not values.", parameter=name,
                               field="values")
    low = _number(raw.get("low"), parameter=parameter, field="low")
    high = _number(raw.get("high"), parameter=parameter, field="high")
    if high < low:
        raise SearchSpaceError(f"{name}: the range is reversed (low {low:g} > high {high:g}).", parameter=name,
                               field="high")
    if kind != "int" and high == low:
        raise SearchSpaceError(f"{name}: the range is empty (low = high = {low:g}); use a categorical value.",
                               parameter=name, field="high")
    if kind == "logfloat" and low <= 0:
        raise SearchSpaceError(f"{name}: a log range needs low > 0.", parameter=name, field="low")
    step: int | None = None
    if raw.get("step") not in (None, ""):
        if kind != "int":
            raise SearchSpaceError(f"{name}: only int ranges take a step.", parameter=name, field="step")
        try:
            step_value = float(raw["step"])
        except (TypeError, ValueError, OverflowError):
            step_value = 0.0
        step = int(step_value) if math.isfinite(step_value) else 0
        if step < 1 or step != step_value:
            raise SearchSpaceError(f"{name}: step {quote(raw['step'])} must be a whole number >= 1.", parameter=name,
                                   field="step")
    return Dimension(parameter.name, kind, low=low, high=high, step=step)


def parse_search_space(raw: object) -> SearchSpace:
    """A search space from its serialized mapping (see the module docstring); every bad parameter is reported
    (`SearchSpaceErrors` when there are several)."""
    if raw is None or (isinstance(raw, Mapping) and not raw):
        raise SearchSpaceError("A search space is a mapping of parameter names to their ranges; it is empty.")
    if not isinstance(raw, Mapping):
        raise SearchSpaceError(f"A search space is a mapping of parameter names to their ranges (name: values, one "
                               f"a line), not {quote(raw)}.")
    dimensions: list[Dimension] = []
    errors: list[SearchSpaceError] = []
    for name, spec in raw.items():
        try:
            dimension = parse_dimension(str(name), spec)
        except SearchSpaceError as error:
            errors.append(error)
            continue
        if any(d.name == dimension.name for d in dimensions):
            errors.append(SearchSpaceError(f"{quote(str(name))} is another name of {dimension.name}, which the space "
                                           "already has; give it once.", parameter=dimension.name, field="name"))
            continue
        dimensions.append(dimension)
    raise_all(errors)
    return SearchSpace(tuple(dimensions))


def space_from_rows(rows: Sequence[Mapping[str, Any]]) -> SearchSpace:
    """A search space from form rows (``name``, ``kind``, ``values`` as comma-separated text, ``low``, ...);
    every bad row is reported (`SearchSpaceErrors` when there are several)."""
    seen: dict[str, str] = {}  # parameter -> the name its row gave
    dimensions = []
    errors: list[SearchSpaceError] = []
    for row in rows:
        name = str(row.get("name", "")).strip()
        earlier = seen.get(canonical_name(name))
        if earlier == name:
            errors.append(SearchSpaceError(f"{quote(name)} appears twice; give each parameter one row.",
                                           parameter=name, field="name"))
            continue
        if earlier is not None:
            errors.append(SearchSpaceError(f"{quote(name)} and {quote(earlier)} are one parameter; give it one row.",
                                           parameter=name, field="name"))
            continue
        seen[canonical_name(name)] = name
        raw: dict[str, Any] = {"kind": row.get("kind")}
        if row.get("kind") == "categorical":
            raw["values"] = [v.strip() for v in str(row.get("values") or "").split(",") if v.strip()]
        else:
            raw.update(low=row.get("low"), high=row.get("high"), step=row.get("step"))
            if str(row.get("values") or "").strip():
                raw["values"] = row["values"]
        try:
            dimensions.append(parse_dimension(name, raw))
        except SearchSpaceError as error:
            errors.append(error)
    raise_all(errors)
    if not dimensions:
        raise SearchSpaceError("Add at least one parameter to search.")
    return SearchSpace(tuple(dimensions))


def rows_from_space(space: SearchSpace) -> list[dict[str, Any]]:
    """The form rows that show `space` (the inverse of `space_from_rows`)."""
    rows = []
    for d in space:
        if d.kind == "categorical":
            rows.append({"name": d.name, "kind": d.kind, "values": ", ".join(_format(v) for v in d.values)})
        else:
            rows.append({"name": d.name, "kind": d.kind, "low": _format(d.low), "high": _format(d.high),
                         "step": d.step})
    return rows


def _format(value: Value | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)
