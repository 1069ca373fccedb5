"""What the rows of an instruction or chat data file hold: its `Kind`, the roles each kind reads, and the column
that holds each role (a `Layout`).

A kind declares its roles (`KIND_ROLES`): the values an example is made of, each read from one column of a
row. A file's layout maps every required role, and each optional one the file has, to a column: the column a
user names for it (``role=column`` on the form, the ``columns`` field of the API), else the first of the role's
common names (`Role.names`) among the file's columns, matched exactly, then without regard to case. With no
kind given, the kinds are tried in the order of `KIND_ROLES` (messages, alpaca, prompt_completion, text), and
the first whose required roles all find a column is the file's: a file with chosen and rejected columns holds
preference pairs, whatever else it holds.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

MAX_COLUMN_CHARS = 200  # a column a user names: longer is a typo, and it is stored with the dataset
SHOWN_COLUMNS = 20  # columns an error message lists; the rest are counted
SHOWN_CHARS = 60  # characters of a column name an error message quotes


class Kind(StrEnum):
    TEXT = "text"  # plain text, every token trained
    PROMPT_COMPLETION = "prompt_completion"  # a prompt and its completion
    ALPACA = "alpaca"  # an instruction, an optional input, an output
    MESSAGES = "messages"  # a conversation: [{role, content}] (OpenAI) or [{from, value}] (ShareGPT)
    PREFERENCE = "preference"  # a prompt (optional when the answers are conversations), a chosen and a rejected answer


@dataclass(frozen=True)
class Role:
    name: str
    names: tuple[str, ...]  # the common column names it is found under, by priority; its own name first
    required: bool = True


KIND_ROLES: dict[Kind, tuple[Role, ...]] = {
    Kind.PREFERENCE: (Role("prompt", ("prompt", "question", "query"), required=False),
                      Role("chosen", ("chosen", "chosen_response")),
                      Role("rejected", ("rejected", "rejected_response"))),
    Kind.MESSAGES: (Role("messages", ("messages", "conversations", "conversation")),),
    Kind.ALPACA: (Role("instruction", ("instruction",)),
                  Role("input", ("input", "context"), required=False),
                  Role("output", ("output", "response", "answer"))),
    Kind.PROMPT_COMPLETION: (Role("prompt", ("prompt", "question", "query", "input")),
                             Role("completion", ("completion", "response", "answer", "output"))),
    Kind.TEXT: (Role("text", ("text",)),),
}
ROLE_NAMES = tuple(dict.fromkeys(role.name for roles in KIND_ROLES.values() for role in roles))


class RecordsError(ValueError):
    """A file that cannot be read into examples at all; the message says why and what is accepted."""


class LayoutError(RecordsError):
    """Columns named for roles that do not fit the file or the kind; the message says which and why."""


@dataclass(frozen=True)
class Layout:
    kind: Kind
    columns: Mapping[str, str] = field(default_factory=dict)  # role -> the column holding it

    @property
    def plain(self) -> bool:
        """Whether every role is read from a column of its own name: such a layout reads any file of its kind
        as every other plain layout does, so the dataset's fingerprint need not include it."""
        return all(role == column for role, column in self.columns.items())


def layout_for(columns: Sequence[str], *, kind: Kind | None, given: Mapping[str, str], fixed: bool = True,
               ) -> Layout:
    """The layout of rows with these `columns` (the first row's keys for JSON, the header for CSV, the schema
    for Parquet): `given`'s columns for its roles, the roles' common names for the others, in `kind` (None:
    the first kind of `KIND_ROLES` that the given roles belong to and every required role finds a column in).
    Unless the columns are `fixed` (a JSON row may have keys the first one lacks), an optional role that none
    of them holds is read from the column of its own name (or the one given), in the rows that have it.

    Raises LayoutError for a given role or column that does not fit, and RecordsError when no kind fits.
    """
    roles = set(given)
    unknown = sorted(roles - set(ROLE_NAMES))
    if unknown:
        raise LayoutError(f"no role {_quoted(unknown)}; the roles are {', '.join(ROLE_NAMES)}")
    if kind is not None and not roles <= {role.name for role in KIND_ROLES[kind]}:
        raise LayoutError(f"kind {kind.value!r} has the roles {_role_list(kind)}; not "
                          f"{_quoted(sorted(roles - {role.name for role in KIND_ROLES[kind]}))}")
    optional = {role.name for roles in KIND_ROLES.values() for role in roles if not role.required}
    missing = [column for role, column in given.items() if column not in columns and (fixed or role not in optional)]
    if missing:
        raise LayoutError(f"no column {_quoted(missing)} in the file; found {listed(columns)}")
    candidates = [kind] if kind is not None else [k for k in KIND_ROLES if roles <= {r.name for r in KIND_ROLES[k]}]
    if not candidates:
        raise LayoutError(f"no kind has all the roles {_quoted(sorted(roles))}: "
                          + "; ".join(f"{k.value} has {_role_list(k)}" for k in KIND_ROLES))
    for candidate in candidates:
        found = _found(candidate, columns, given, fixed=fixed)
        if found is not None:
            return Layout(kind=candidate, columns=found)
    if kind is not None:
        needed = [role.name for role in KIND_ROLES[kind] if role.required and role.name not in given]
        raise RecordsError(f"kind {kind.value!r} needs {_accepted(kind)}; found {listed(columns)}. Name the "
                           f"column{'s' if len(needed) > 1 else ''} for {', '.join(needed)} under Columns, e.g. "
                           f"{needed[0]}=your_column")
    accepted = "; ".join(f"{k.value}: {_accepted(k)}" for k in KIND_ROLES)
    raise RecordsError(f"no known columns: found {listed(columns)}; accepted: {accepted}. Or name the column of "
                       "each role under Columns, e.g. prompt=question, completion=answer")


def _found(kind: Kind, columns: Sequence[str], given: Mapping[str, str], *, fixed: bool) -> dict[str, str] | None:
    """Each role of `kind` with its column (given, else its first common name present, else for an optional role
    of columns not `fixed` its own name), or None when a required role has none. A column serves one role."""
    taken = set(given.values())
    folded: dict[str, str] = {}
    for column in columns:
        folded.setdefault(column.casefold(), column)
    found: dict[str, str] = {}
    for role in KIND_ROLES[kind]:
        column = given.get(role.name)
        if column is None:
            exact = [name for name in role.names if name in columns and name not in taken]
            loose = [folded[name] for name in role.names if name in folded and folded[name] not in taken]
            own = [] if fixed or role.required or role.name in taken else [role.name]
            column = (exact or loose or own or [None])[0]
        if column is None:
            if role.required:
                return None
            continue
        found[role.name] = column
        taken.add(column)
    return found


def columns_parse(text: str) -> dict[str, str]:
    """The role-to-column mapping a user wrote: a JSON object (``{"prompt": "question"}``) or ``role=column``
    pairs separated by commas or new lines; blank: none. Raises LayoutError saying what is wrong with it."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as error:
            raise LayoutError(f"not a JSON object of role: column pairs ({error})") from None
        if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
            raise LayoutError('give a JSON object of role: column strings, e.g. {"prompt": "question"}')
        pairs = [(role.strip(), column.strip()) for role, column in parsed.items()]
    else:
        pairs = []
        for item in text.replace("\n", ",").split(","):
            if not item.strip():
                continue
            role, equals, column = item.partition("=")
            if not equals:
                raise LayoutError(f"{_cut(item.strip())!r} is not role=column, e.g. prompt=question")
            pairs.append((role.strip(), column.strip()))
    mapping: dict[str, str] = {}
    for role, column in pairs:
        if not role or not column:
            raise LayoutError("every pair needs a role and a column, e.g. prompt=question")
        if "\x00" in role or "\x00" in column:
            raise LayoutError("a role or column contains a NUL character")
        if len(column) > MAX_COLUMN_CHARS:
            raise LayoutError(f"the column for {role!r} is over {MAX_COLUMN_CHARS} characters")
        if role in mapping:
            raise LayoutError(f"{role!r} is given twice")
        mapping[role] = column
    if len(set(mapping.values())) < len(mapping):
        raise LayoutError("each role needs a column of its own")
    return mapping


def columns_text(columns: Mapping[str, str]) -> str:
    """A layout's columns as the form writes them: ``prompt=question, completion=answer``."""
    return ", ".join(f"{role}={column}" for role, column in columns.items())


def listed(columns: Collection[str]) -> str:
    """Column names for a message: quoted, each cut to `SHOWN_CHARS` characters, the first `SHOWN_COLUMNS`."""
    if not columns:
        return "no columns"
    names = list(columns)
    shown = ", ".join(repr(_cut(name)) for name in names[:SHOWN_COLUMNS])
    rest = len(names) - SHOWN_COLUMNS
    return f"{shown} and {rest:,} more" if rest > 0 else shown


def _cut(name: str) -> str:
    return name if len(name) <= SHOWN_CHARS else f"{name[:SHOWN_CHARS]}… ({len(name):,} characters)"


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(repr(_cut(name)) for name in names[:SHOWN_COLUMNS])


def _role_list(kind: Kind) -> str:
    return ", ".join(role.name + ("" if role.required else " (optional)") for role in KIND_ROLES[kind])


def _accepted(kind: Kind) -> str:
    """The columns that make `kind`: each required role's common names, then the optional ones."""
    def names(role: Role) -> str:
        return "/".join(role.names)

    required = " + ".join(names(role) for role in KIND_ROLES[kind] if role.required)
    optional = [names(role) for role in KIND_ROLES[kind] if not role.required]
    return f"{required} (optional: {', '.join(optional)})" if optional else required
