"""No text reaches the database with a NUL character in it.

PostgreSQL's text and jsonb refuse U+0000 ("text fields cannot contain NUL", "unsupported Unicode escape
sequence"), and the error aborts the whole transaction it happens in: a name, a filter or a worker's message
carrying one would answer 500, or stop the batch of trial events it came in. So, one rule in two halves:

- **What people type is refused**, with a message under the field (`NUL_REFUSED`, Django's own words, which
  its ``forms.CharField`` already says for a field's text): `refuse_nul` checks any value, and the structures
  parsed from text (a search space's YAML or JSON, an API body's objects, a search box, a filter) go through it
  before they are used. Nobody types a NUL on purpose; an error says what to fix without guessing.
- **What machines produce is kept, with each NUL replaced by U+FFFD** (the replacement character, shown as
  "�"): a worker's report on a trial, a model's output, an error message quoting a file, text read back from a
  dataset. `nul_replaced` is installed on every database connection the project opens
  (`install_on_connections`), so that no path from a machine to a row can be forgotten: it replaces NUL in
  every parameter of every query (strings, the strings of a bulk insert's arrays, and the strings inside JSON
  values) before the database sees it.
  Whatever a person's text reaches it has been refused already, so it changes only machine text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

NUL = "\x00"
REPLACEMENT = "\ufffd"
NUL_REFUSED = "Null characters are not allowed."


def has_nul(value: object) -> bool:
    """Whether `value` (text, or lists, tuples and dicts of them, keys included) holds a NUL anywhere."""
    if isinstance(value, str):
        return NUL in value
    if isinstance(value, Mapping):
        return any(has_nul(key) or has_nul(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(item) for item in value)
    return False


def refuse_nul(value: object, *, field: str | None = None, what: str = "") -> None:
    """Raise ValidationError (under `field` when given) when `value` holds a NUL anywhere; `what` names the
    value in the message ("The search: Null characters ...")."""
    if has_nul(value):
        message = f"{what}: {NUL_REFUSED[0].lower()}{NUL_REFUSED[1:]}" if what else NUL_REFUSED
        raise ValidationError({field: message} if field else message, code="null_characters_not_allowed")


def without_nul(value: Any) -> Any:
    """`value` with each NUL in its text (lists, tuples and dicts walked, keys included) replaced by U+FFFD;
    anything else as it is. Returns `value` itself when there was none."""
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT) if NUL in value else value
    if not has_nul(value):
        return value
    if isinstance(value, Mapping):
        return {without_nul(key): without_nul(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(without_nul(item) for item in value)
    return [without_nul(item) for item in value]


def _param(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT) if NUL in value else value
    if isinstance(value, list):  # a column's values, which a bulk insert on PostgreSQL sends as one array
        return [_param(item) for item in value]
    obj = getattr(value, "obj", None)  # psycopg's Jsonb and Json wrap the JSON value Django hands them
    if obj is not None and hasattr(value, "dumps") and has_nul(obj):
        return type(value)(without_nul(obj), value.dumps)
    return value


def _params(params: Any) -> Any:
    if params is None:
        return None
    if isinstance(params, Mapping):
        return {key: _param(value) for key, value in params.items()}
    return [_param(value) for value in params]


def nul_replaced(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Mapping[str, Any]
                 ) -> Any:
    """A database execute wrapper (Django's ``execute_wrappers``): runs the query with NUL replaced in its
    parameters, one set or (``executemany``) each of many."""
    params = [_params(one) for one in params] if many else _params(params)
    return execute(sql, params, many, context)


def _install(sender: type, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if nul_replaced not in connection.execute_wrappers:
        connection.execute_wrappers.insert(0, nul_replaced)


def install_on_connections() -> None:
    """Put `nul_replaced` on every database connection, as it opens (call once, when the apps are ready)."""
    connection_created.connect(_install, dispatch_uid="webapp.nul_text")
