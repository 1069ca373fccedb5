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


def preference_messages(row: Row, columns: Columns) -> tuple[tuple[Message, ...], ...]:
    """(prompt, chosen, rejected) messages of a preference pair. An answer is a string (the assistant's message)
    or a list of messages; the prompt, a string (the user's message) or a list of messages, may be left out when
    both answers are lists, whose shared prompt turns are then every message before each one's closing assistant
    turns. An answer list that begins with the prompt's turns (UltraFeedback's layout) is read from after them.
    Raises BadValue for a missing or malformed value, an answer without a closing assistant turn, prompt turns
    that differ, and two answers that are the same."""
    given = columns.get("prompt")
    prompt = _conversation(row, given, "user") if given is not None and row.get(given) is not None else None
    answers = [_conversation(row, columns[which], "assistant") for which in ("chosen", "rejected")]
    if prompt is None:
        if not all(isinstance(row.get(columns[which]), list) for which in ("chosen", "rejected")):
            raise BadValue(f"missing '{given or 'prompt'}': answers given as strings need a prompt")
        cuts = [_last_prompt_turn(answer, columns[which]) for answer, which in zip(answers, ("chosen", "rejected"),
                                                                                   strict=True)]
        prompt = answers[0][: cuts[0]]
        if answers[1][: cuts[1]] != prompt:
            raise BadValue(f"the prompt turns of '{columns['chosen']}' and '{columns['rejected']}' differ: both "
                           "must begin with the same messages before their answers")
        answers = [answer[cut:] for answer, cut in zip(answers, cuts, strict=True)]
    else:
        answers = [answer[len(prompt):] if answer[: len(prompt)] == prompt else answer for answer in answers]
    for answer, which in zip(answers, ("chosen", "rejected"), strict=True):
        if not answer:
            raise BadValue(f"'{columns[which]}' holds only the prompt's turns, no answer")
        if answer[-1]["role"] != "assistant":
            raise BadValue(f"'{columns[which]}' does not end with an assistant turn")
    if answers[0] == answers[1]:
        raise BadValue(f"'{columns['chosen']}' and '{columns['rejected']}' are the same answer")
    return prompt, answers[0], answers[1]


def _conversation(row: Row, column: str, role: str) -> tuple[Message, ...]:
    """The value in `column`: a string as one message of `role`, or a list of messages."""
    value = row.get(column)
    if isinstance(value, list):
        if not value:
            raise BadValue(f"'{column}' is an empty list")
        try:
            return tuple(_message(message, number) for number, message in enumerate(value, 1))
        except BadValue as error:
            raise BadValue(f"'{column}': {error}") from None
    if value is not None and not isinstance(value, str):
        raise BadValue(f"'{column}' is {described(value)}, not a string or a list of messages")
    return ({"role": role, "content": nonempty_string(row, column)},)


def _last_prompt_turn(messages: tuple[Message, ...], column: str) -> int:
    """Where the closing assistant turns of a conversation begin: the messages before them are its prompt."""
    if messages[-1]["role"] != "assistant":
        raise BadValue(f"'{column}' does not end with an assistant turn")
    cut = len(messages)
    while cut and messages[cut - 1]["role"] == "assistant":
        cut -= 1
    if cut == 0:
        raise BadValue(f"'{column}' has no prompt turn before its answer; give the prompt in its own column")
    return cut


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
