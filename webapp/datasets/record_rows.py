"""Turn one row of an instruction or chat file into normalized messages, or say why it cannot be one.

A row is a dict of column values (a JSON object, a CSV row, a Parquet row); `columns` maps the roles of the
row's kind to its columns (`layouts.Layout`). Every function here returns what the row holds or raises
`BadValue`, whose message is the row's reason in `BadRow`. Strings are kept exactly as written; only emptiness
is checked, on the stripped value, and a NUL character: no text that trains a model or is stored in the
database may hold one (PostgreSQL refuses it in text), so such a row is bad. A null is treated as missing.
"""

from __future__ import annotations

from collections.abc import Mapping

ROLES = ("system", "user", "assistant")
OPENAI_ROLES = {role: role for role in ROLES}
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system"}

Message = dict[str, str]
Row = Mapping[str, object]
Columns = Mapping[str, str]  # role -> column


class BadValue(ValueError):
    """A row that cannot become an example; the message says why, naming the column or message."""


def nonempty_string(row: Row, column: str) -> str:
    """The string in `column`, unchanged; missing, not a string, or blank raises BadValue."""
    value = row.get(column)
    if value is None:
        raise BadValue(f"missing '{column}'")
    if not isinstance(value, str):
        raise BadValue(f"'{column}' is {described(value)}, not a string")
    if not value.strip():
        raise BadValue(f"empty {column}")
    _refuse_nul(value, f"'{column}'")
    return value


def text_value(row: Row, columns: Columns) -> str:
    """The text, from the column of the role ``text``."""
    return nonempty_string(row, columns["text"])


def prompt_completion_messages(row: Row, columns: Columns) -> tuple[Message, ...]:
    """The prompt as the user's message, the completion as the assistant's."""
    return _turn(nonempty_string(row, columns["prompt"]), nonempty_string(row, columns["completion"]))


def alpaca_messages(row: Row, columns: Columns) -> tuple[Message, ...]:
    """The instruction as the user's message, followed by a blank line and the input when there is one
    (an input that is missing, null or blank adds nothing); the output as the assistant's message."""
    instruction = nonempty_string(row, columns["instruction"])
    extra = row.get(columns["input"]) if "input" in columns else None
    if extra is not None and not isinstance(extra, str):
        raise BadValue(f"'{columns['input']}' is {described(extra)}, not a string")
    if extra:
        _refuse_nul(extra, f"'{columns['input']}'")
    prompt = f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction
    return _turn(prompt, nonempty_string(row, columns["output"]))


def chat_messages(row: Row, column: str) -> tuple[Message, ...]:
    """The conversation in `column`: a list of OpenAI ``{role, content}`` or ShareGPT ``{from, value}``
    messages (told apart per message), normalized to ``{"role", "content"}`` with roles in `ROLES`. A
    conversation without an assistant message has nothing to train on, so it is bad too."""
    value = row.get(column)
    if value is None:
        raise BadValue(f"missing '{column}'")
    if not isinstance(value, list):
        raise BadValue(f"'{column}' is {described(value)}, not a list")
    messages = tuple(_message(message, number) for number, message in enumerate(value, 1))
    if not any(message["role"] == "assistant" for message in messages):
        raise BadValue("no assistant message")
    return messages


def described(value: object) -> str:
    """`value`'s type with its article, in JSON's word for a dict: "a str", "an int", "an object"."""
    name = "object" if isinstance(value, dict) else type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _message(message: object, number: int) -> Message:
    if not isinstance(message, dict):
        raise BadValue(f"message {number} is {described(message)}, not an object")
    sharegpt = "role" not in message and "content" not in message and ("from" in message or "value" in message)
    role_key, content_key, roles = ("from", "value", SHAREGPT_ROLES) if sharegpt else ("role", "content", OPENAI_ROLES)
    role, content = message.get(role_key), message.get(content_key)
    if role is None:
        raise BadValue(f"missing {role_key} in message {number}")
    if not isinstance(role, str) or role not in roles:
        raise BadValue(f"unknown role {role!r} in message {number} (use {_either(tuple(roles))})")
    if content is None:
        raise BadValue(f"missing {content_key} in message {number}")
    if not isinstance(content, str):
        raise BadValue(f"{content_key} in message {number} is {described(content)}, not a string")
    if not content.strip():
        raise BadValue(f"empty {content_key} in message {number}")
    _refuse_nul(content, f"{content_key} of message {number}")
    return {"role": roles[role], "content": content}


def _refuse_nul(value: str, where: str) -> None:
    if "\x00" in value:
        raise BadValue(f"a NUL character in {where} (at character {value.index(chr(0)) + 1})")


def _turn(prompt: str, answer: str) -> tuple[Message, ...]:
    return ({"role": "user", "content": prompt}, {"role": "assistant", "content": answer})


def _either(names: tuple[str, ...]) -> str:
    return f"{', '.join(names[:-1])} or {names[-1]}"
