"""Search spaces: typed hyperparameters, parsed from form rows or YAML/JSON, expanded to grids.

Pure (no Django). A search space is an ordered mapping ``name -> Dimension``; its serialized form, which is
also the YAML/JSON users paste and download, is::

    lr:         {kind: logfloat, low: 1.0e-4, high: 1.0e-2}
    batch_size: {kind: categorical, values: [8, 16]}
    n_layer:    {kind: int, low: 2, high: 6, step: 2}

and a bare list of values is read as a categorical one (``batch_size: [8, 16]``).

Pasted text may also name the model, beside the parameters, under the key ``model`` (`load_spec_text`):
``model: {preset: llama-micro}``, ``model: {checkpoint: <catalog name>}`` or a custom size such as
``model: {family: llama, n_layer: 4, n_embd: 128, n_head: 4, n_kv_head: 2, n_positions: 512}``; and how often
its trials take durable checkpoints, under ``checkpoint_minutes`` (`checkpoint_minutes_of_text`); and, for
instruction and chat data, the chat template that renders its conversations, under ``chat_template``
(`chat_template_of_text`).

Instruction data adds three parameters: ``packing`` (``[true, false]``: several whole examples in a row, or
one), ``loss_on`` (which tokens the loss covers: ``assistant``, ``last`` or ``all``) and the sequence length,
which may be written ``max_seq_len`` there (`ALIASES`): on examples it is the longest one a row holds, longer
ones being dropped, never cut. It is one parameter, stored and shown as ``seq_len``.

Every error is a `SearchSpaceError` naming the parameter and the field, so forms can put it beside the row.
Pasted text is read by `load_search_space_text`, whose cost is bounded by the text's length: YAML anchors
and aliases (which let a few hundred characters stand for a billion values) are refused, and so are
documents deeper or larger than a search space can be. Messages quote at most `QUOTE_CHARS` of any value.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from webapp.nul_text import has_nul
from webapp.worker_door import MAX_CHECKPOINT_MINUTES

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
TEMPLATE_KEY = "chat_template"  # ... and the chat template of its instruction data


class SearchSpaceError(ValueError):
    """A bad search space. ``parameter`` and ``field`` say where (``None`` for the space as a whole)."""

    def __init__(self, message: str, *, parameter: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.field = field


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
        ParameterDef("micro_batches", "micro-batches per step (gradient accumulation; each must divide the batch)",
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
        ParameterDef("n_embd", "width (embedding size)", int, ("categorical", "int"), 0, 8, 16_384,
                     architecture=True),
        ParameterDef("n_layer", "depth (transformer blocks)", int, ("categorical", "int"), 0, 1, 256,
                     architecture=True),
    ]
}
ALIASES = {"max_seq_len": "seq_len"}  # other names a parameter may be written with
FLAGS = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}  # a bool row's words


def canonical_name(name: str) -> str:
    """The parameter `name` stands for (itself unless it is one of `ALIASES`)."""
    return ALIASES.get(name, name)


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
        aliases = ", ".join(f"{alias} (another name of {target})" for alias, target in ALIASES.items())
        raise SearchSpaceError(
            f"Unknown parameter {quote(name)}; Hydra searches {', '.join(PARAMETERS)} and {aliases}.",
            parameter=name, field="name"
        )
    if isinstance(raw, list):  # a bare list of values: ``packing: [true, false]``
        raw = {"kind": "categorical", "values": raw}
    if not isinstance(raw, Mapping):
        raise SearchSpaceError(f"{name}: give a list of values, or a mapping with kind and values or low/high.",
                               parameter=name)
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
    """A search space from its serialized mapping (see the module docstring)."""
    if not isinstance(raw, Mapping) or not raw:
        raise SearchSpaceError("A search space is a mapping of parameter names to their ranges; it is empty.")
    dimensions = []
    for name, spec in raw.items():
        dimension = parse_dimension(str(name), spec)
        if any(d.name == dimension.name for d in dimensions):
            raise SearchSpaceError(f"{quote(str(name))} is another name of {dimension.name}, which the space "
                                   "already has; give it once.", parameter=dimension.name, field="name")
        dimensions.append(dimension)
    return SearchSpace(tuple(dimensions))


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases, and with at most `MAX_NODES` nodes `MAX_DEPTH` deep."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.nodes = 0
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise SearchSpaceError("YAML anchors and aliases (& and *) are not accepted; write each value out.",
                                   field="space_text")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise SearchSpaceError(f"The search space has more than {MAX_NODES} entries; it needs far fewer.",
                                   field="space_text")
        if self.depth >= MAX_DEPTH:
            raise SearchSpaceError("The search space nests too deep: give parameter: {kind: ..., values: [...]}.",
                                   field="space_text")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_search_space_text(text: str) -> SearchSpace:
    """A search space from pasted YAML or JSON (JSON is read as YAML); raises SearchSpaceError."""
    return parse_search_space(_load_text(text))


def load_spec_text(text: str) -> tuple[object | None, SearchSpace]:
    """Pasted YAML or JSON that may also name the model under the key ``model`` (see
    `model_shapes.model_from_spec`): that entry, unchecked (None without one), and the search space."""
    raw = _load_text(text)
    if isinstance(raw, Mapping) and any(key in raw for key in (MODEL_KEY, CHECKPOINT_KEY, PRUNER_KEY, HOLDOUT_KEY,
                                                               TEMPLATE_KEY)):
        raw = dict(raw)
        raw.pop(TEMPLATE_KEY, None)  # read by `chat_template_of_text`
        raw.pop(HOLDOUT_KEY, None)  # read by `holdout_bytes_of_text`
        raw.pop(CHECKPOINT_KEY, None)  # read by `checkpoint_minutes_of_text`
        raw.pop(PRUNER_KEY, None)  # read by `pruner_of_text`
        return raw.pop(MODEL_KEY, None), parse_search_space(raw)
    return None, parse_search_space(raw)


def pruner_of_text(text: str) -> tuple[bool, object]:
    """Whether pasted YAML or JSON names a ``pruner``, and its entry, unchecked (see
    `webapp.experiments.pruning.pruner_spec`)."""
    raw = _load_text(text)
    if not isinstance(raw, Mapping) or PRUNER_KEY not in raw:
        return False, None
    return True, raw[PRUNER_KEY]


def holdout_bytes_of_text(text: str) -> int | None:
    """The ``holdout_bytes`` pasted YAML or JSON sets (None when it sets none: the whole validation text); a
    `SearchSpaceError` on the pasted text for anything but a whole number of bytes from 1."""
    raw = _load_text(text)
    if not isinstance(raw, Mapping) or HOLDOUT_KEY not in raw or raw[HOLDOUT_KEY] is None:
        return None
    value = raw[HOLDOUT_KEY]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HOLDOUT_BYTES:
        raise SearchSpaceError(f"{HOLDOUT_KEY}: {quote(value)} is not a whole number of bytes from 1 (empty: the "
                               "whole validation text).", field="space_text")
    return value


def checkpoint_minutes_of_text(text: str) -> int | None:
    """The ``checkpoint_minutes`` pasted YAML or JSON sets (None when it sets none); a `SearchSpaceError` on
    the pasted text for anything but a whole number of minutes from 0 (no checkpoints) to a week."""
    raw = _load_text(text)
    if not isinstance(raw, Mapping) or CHECKPOINT_KEY not in raw:
        return None
    value, most = raw[CHECKPOINT_KEY], int(MAX_CHECKPOINT_MINUTES)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise SearchSpaceError(f"{CHECKPOINT_KEY}: {quote(value)} is not a whole number of minutes from 0 (no "
                               f"checkpoints) to {most}.", field="space_text")
    return value


def chat_template_of_text(text: str) -> str | None:
    """The ``chat_template`` pasted YAML or JSON sets (None when it sets none; an empty text is none too, as
    in the form); a `SearchSpaceError` on the pasted text for anything but text. Unchecked: see
    `webapp.experiments.chat_template`."""
    raw = _load_text(text)
    if not isinstance(raw, Mapping) or raw.get(TEMPLATE_KEY) is None:
        return None
    value = raw[TEMPLATE_KEY]
    if not isinstance(value, str):
        raise SearchSpaceError(f"{TEMPLATE_KEY}: {quote(value)} is not a template; give the Jinja template as text "
                               "(a quoted string, or a YAML block after |).", field="space_text")
    return value


def _unreadable(error: yaml.YAMLError) -> SearchSpaceError:
    detail = str(error)  # PyYAML quotes at most a line's snippet; a long line is cut here
    if len(detail) > 300:
        detail = detail[:299] + "…"
    return SearchSpaceError(f"This is neither YAML nor JSON: {detail}", field="space_text")


def _load_text(text: str) -> object:
    try:
        loader = _BoundedLoader(text)  # reads the text's characters already: a control character fails here
    except yaml.YAMLError as error:
        raise _unreadable(error) from None
    try:
        raw = loader.get_single_data()
    except SearchSpaceError:
        raise
    except yaml.YAMLError as error:
        raise _unreadable(error) from None
    except ValueError:  # an integer with more digits than int() reads
        raise SearchSpaceError("The search space holds a number too long to read.", field="space_text") from None
    finally:
        loader.dispose()
    if has_nul(raw):  # an escape (\0, \u0000) the text box let through: no name or value has one
        raise SearchSpaceError("The search space holds a null character (\\0 or \\u0000): null characters are "
                               "not allowed.", field="space_text")
    return raw


def space_from_rows(rows: Sequence[Mapping[str, Any]]) -> SearchSpace:
    """A search space from form rows (``name``, ``kind``, ``values`` as comma-separated text, ``low``, ...)."""
    seen: dict[str, str] = {}  # parameter -> the name its row gave
    dimensions = []
    for row in rows:
        name = str(row.get("name", "")).strip()
        earlier = seen.get(canonical_name(name))
        if earlier == name:
            raise SearchSpaceError(f"{quote(name)} appears twice; give each parameter one row.", parameter=name,
                                   field="name")
        if earlier is not None:
            raise SearchSpaceError(f"{quote(name)} and {quote(earlier)} are one parameter; give it one row.",
                                   parameter=name, field="name")
        seen[canonical_name(name)] = name
        raw: dict[str, Any] = {"kind": row.get("kind")}
        if row.get("kind") == "categorical":
            raw["values"] = [v.strip() for v in str(row.get("values") or "").split(",") if v.strip()]
        else:
            raw.update(low=row.get("low"), high=row.get("high"), step=row.get("step"))
            if str(row.get("values") or "").strip():
                raw["values"] = row["values"]
        dimensions.append(parse_dimension(name, raw))
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
