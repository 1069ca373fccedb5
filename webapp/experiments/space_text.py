"""Pasted search spaces: YAML or JSON text (JSON is read as YAML) into the serialized form `search_space` parses.

Beside the parameters, the text may name the experiment's model under ``model`` (`load_spec_text`), how often
its trials take durable checkpoints under ``checkpoint_minutes``, its pruner under ``pruner``, the size of the
final evaluation's held-out text under ``holdout_bytes``, the most devices a trial's micro-batches run on at once
under ``max_devices_per_trial``, what its trials minimize under ``objective`` (``sft`` or ``dpo``), and, for
instruction and chat data, the chat template under ``chat_template``.
The form, the API and the command line all read pasted text through this module, so they say the same things
about it.

Reading costs no more than the text's length: YAML anchors and aliases (which let a few hundred characters
stand for a billion values) are refused, and so are documents deeper or larger than a search space can be.
Text that is neither YAML nor JSON gets one line saying where (line and column, counted from 1) and what is
wrong, instead of PyYAML's multi-line report.
"""

from __future__ import annotations

from collections.abc import Mapping

import yaml

from webapp.experiments.search_space import (
    CHECKPOINT_KEY,
    DEVICES_KEY,
    HOLDOUT_KEY,
    MAX_DEPTH,
    MAX_HOLDOUT_BYTES,
    MAX_NODES,
    MODEL_KEY,
    OBJECTIVE_KEY,
    PRUNER_KEY,
    TEMPLATE_KEY,
    SearchSpace,
    SearchSpaceError,
    parse_search_space,
    quote,
)
from webapp.nul_text import has_nul
from webapp.worker_door import MAX_CHECKPOINT_MINUTES, MAX_DEVICES_PER_TRIAL

# PyYAML's names for what it expected or found, and for what it was reading, in a user's words.
TOKEN_WORDS = {"<stream end>": "the end of the text", "<scalar>": "a value", "<block end>": "the end of a block",
               "<block mapping start>": "a new indented block", "<block sequence start>": "a new indented list",
               "<flow mapping start>": "{", "<flow sequence start>": "[", "<block entry>": "a '- ' list entry"}
CONTEXT_WORDS = {"while parsing a flow sequence": "the [ list", "while parsing a flow mapping": "the { mapping",
                 "while parsing a block mapping": "the block", "while parsing a block collection": "the block",
                 "while scanning a quoted scalar": "the quoted text", "while scanning a simple key": "the name"}


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
    """A search space from pasted YAML or JSON; raises SearchSpaceError (every bad parameter at once)."""
    return parse_search_space(_load_text(text))


def load_spec_text(text: str) -> tuple[object | None, SearchSpace]:
    """Pasted YAML or JSON that may also name the model under the key ``model`` (see
    `model_shapes.model_from_spec`): that entry, unchecked (None without one), and the search space."""
    raw = _load_text(text)
    if isinstance(raw, Mapping) and any(key in raw for key in (MODEL_KEY, CHECKPOINT_KEY, PRUNER_KEY, HOLDOUT_KEY,
                                                               TEMPLATE_KEY, DEVICES_KEY, OBJECTIVE_KEY)):
        raw = dict(raw)
        raw.pop(OBJECTIVE_KEY, None)  # read by `objective_of_text`
        raw.pop(DEVICES_KEY, None)  # read by `max_devices_of_text`
        raw.pop(TEMPLATE_KEY, None)  # read by `chat_template_of_text`
        raw.pop(HOLDOUT_KEY, None)  # read by `holdout_bytes_of_text`
        raw.pop(CHECKPOINT_KEY, None)  # read by `checkpoint_minutes_of_text`
        raw.pop(PRUNER_KEY, None)  # read by `pruner_of_text`
        return raw.pop(MODEL_KEY, None), parse_search_space(raw)
    return None, parse_search_space(raw)


def objective_of_text(text: str) -> object | None:
    """The ``objective`` pasted YAML or JSON names (None when it names none), unchecked (see
    `webapp.experiments.objective.objective_of`)."""
    raw = _load_text(text)
    if not isinstance(raw, Mapping) or raw.get(OBJECTIVE_KEY) is None:
        return None
    return raw[OBJECTIVE_KEY]


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


def max_devices_of_text(text: str) -> tuple[bool, int | None]:
    """Whether pasted YAML or JSON sets ``max_devices_per_trial``, and to what (None: every device a trial's
    micro-batches can use); a `SearchSpaceError` on the pasted text for anything but a whole number of devices
    from 1 or null."""
    raw = _load_text(text)
    if not isinstance(raw, Mapping) or DEVICES_KEY not in raw:
        return False, None
    value = raw[DEVICES_KEY]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value <= MAX_DEVICES_PER_TRIAL):
        raise SearchSpaceError(f"{DEVICES_KEY}: {quote(value)} is not a whole number of devices from 1 to "
                               f"{MAX_DEVICES_PER_TRIAL} (null: as many as a trial has micro-batches).",
                               field="space_text")
    return True, value


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


def _words(text: str) -> str:
    for token, words in TOKEN_WORDS.items():
        text = text.replace(f"'{token}'", words)
    return text


def _at(text: str, position: int) -> str:
    """Where character `position` of `text` is, as "line L, column C" (from 1)."""
    before = text[:position]
    return f"line {before.count(chr(10)) + 1}, column {position - (before.rfind(chr(10)) + 1) + 1}"


def unreadable(error: yaml.YAMLError, text: str) -> SearchSpaceError:
    """PyYAML's error about `text` as one line: where (line and column, from 1), what is wrong and, when it
    started earlier, what was being read."""
    if isinstance(error, yaml.reader.ReaderError):
        code = ord(error.character) if isinstance(error.character, str) else error.character
        what = f"the character U+{code:04X} is not allowed" if isinstance(code, int) else "a character is not allowed"
        return SearchSpaceError(f"The pasted text is neither YAML nor JSON: {_at(text, error.position)}: {what}.",
                                field="space_text")
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or "it cannot be read"
    if "'\\t'" in problem:
        problem = "a tab; YAML indents with spaces"
    message = _words(problem)
    if mark is not None:
        message = f"line {mark.line + 1}, column {mark.column + 1}: {message}"
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context in CONTEXT_WORDS and start is not None and mark is not None and start.line != mark.line:
        message += f" (in {CONTEXT_WORDS[context]} that opens at line {start.line + 1}, column {start.column + 1})"
    return SearchSpaceError(f"The pasted text is neither YAML nor JSON: {message[:300]}.", field="space_text")


def _load_text(text: str) -> object:
    try:
        loader = _BoundedLoader(text)  # reads the text's characters already: a control character fails here
    except yaml.YAMLError as error:
        raise unreadable(error, text) from None
    try:
        raw = loader.get_single_data()
    except SearchSpaceError:
        raise
    except yaml.YAMLError as error:
        raise unreadable(error, text) from None
    except ValueError:  # an integer with more digits than int() reads
        raise SearchSpaceError("The search space holds a number too long to read.", field="space_text") from None
    finally:
        loader.dispose()
    if has_nul(raw):  # an escape (\0, \u0000) the text box let through: no name or value has one
        raise SearchSpaceError("The search space holds a null character (\\0 or \\u0000): null characters are "
                               "not allowed.", field="space_text")
    return raw
