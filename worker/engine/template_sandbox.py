"""Chat templates rendered in a process of their own, under a time and a memory limit.

A chat template is Jinja that a user typed, or that came with a checkpoint. transformers renders it in Jinja's
sandbox, which stops a template from reaching Python's objects but not from working: a loop in a loop, or a
string doubled in one, runs for ever or fills the memory, and a guard (``{% if 'BOOM' in ... %}``,
``{% if eos_token %}``) lets it pass one conversation and not the next. So every rendering of such a template
happens in a child process (`Sandbox`), which renders one conversation per request, with its prefixes (what
finding the assistant's turns needs), and for each request:

- answers within `RENDER_SECONDS`, or is killed;
- lives in `RENDER_MEMORY_BYTES` of address space (``RLIMIT_AS``): a template that fills it fails there, or the
  child dies, never its parent;
- returns at most twice the conversation's text plus `RENDER_SLACK_CHARS` characters for each rendering, so that
  what comes back cannot fill the parent either.

Past a limit the request raises `TemplateLimitError` (the child, killed, is started again by the next
request); a template that fails as Jinja raises `worker.engine.chat.TemplateError` as in-process rendering
would. Renderings are transformers' own (`render_jinja_template`, which ``apply_chat_template`` calls), so text
from here equals ``apply_chat_template``'s.

The protocol on the child's stdin and stdout: one JSON document a line each way. The child first says
``{"ready": true}`` once it has imported what it renders with (seconds on a busy host, within `START_SECONDS`),
so that its start-up never counts against a template's `RENDER_SECONDS`. A request is
``{"template"?: str, "tokens": {...}, "renders": [[messages, add_generation_prompt], ...], "max_chars": [...]}``
(the template only when it differs from the last one sent); an answer ``{"texts": [...]}``,
``{"error": "TypeName: message"}``, ``{"memory": true}`` or ``{"too_long": [index, chars]}``.
"""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from worker.engine.errors import SpecError

RENDER_SECONDS = 20.0  # a conversation's renderings take milliseconds, unless the template loops
RENDER_MEMORY_BYTES = 2 << 30  # the child's address space (about 200 MiB of it is Python and Jinja)
RENDER_SLACK_CHARS = 1 << 20  # what a template may add to a conversation's text, beyond doubling it
START_SECONDS = 120.0  # the child's start-up (Python, transformers' Jinja rendering), on however busy a host

Message = Mapping[str, str]
Render = tuple[Sequence[Message], bool]  # a conversation, and whether to open the assistant's answer after it


class TemplateLimitError(SpecError):
    """A chat template that takes longer than `RENDER_SECONDS`, more memory than `RENDER_MEMORY_BYTES`, or
    makes a text far longer than its conversation, to render a conversation. Not a
    `worker.engine.chat.TemplateError`: it is about the template, not one conversation, so a dataset's build
    stops at it instead of leaving the example out and meeting the same for the next."""


class SandboxStartError(RuntimeError):
    """The sandbox's child did not start within `START_SECONDS`: the host's fault, not the template's."""


class TemplateRenderError(SpecError):
    """The template itself failed on a conversation (a syntax error, a sandbox violation, ``raise_exception``);
    the message is ``TypeName: message`` of the template's exception."""


def max_chars(messages: Sequence[Message]) -> int:
    """The longest text a conversation's rendering may have: twice its messages' text, plus the slack."""
    return 2 * sum(len(str(message.get("content", ""))) for message in messages) + RENDER_SLACK_CHARS


class Sandbox:
    """One child process that renders templates, started when first asked and again after it is killed. Its
    requests take turns (a lock); a process forked from its owner starts its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._owner = 0  # the pid that started the child
        self._memory = 0  # the child's address-space limit
        self._template: str | None = None  # the last template the child was sent

    def render(self, template: str, tokens: Mapping[str, Any], renders: Sequence[Render]) -> list[str]:
        """The text of each of `renders` under `template`, with the special tokens `tokens` (a tokenizer's
        ``special_tokens_map``) in the template's variables. Raises TemplateRenderError, TemplateLimitError."""
        turns = max((len(messages) for messages, _ in renders), default=0)
        request: dict[str, Any] = {
            "tokens": dict(tokens), "renders": [[list(map(dict, messages)), bool(agp)] for messages, agp in renders],
            "max_chars": [max_chars(messages) for messages, _ in renders]}
        with self._lock:
            child = self._running()
            if template != self._template:
                request["template"] = template
            try:
                answer = self._ask(child, json.dumps(request).encode() + b"\n")
            except TimeoutError:
                self._stop()
                raise TemplateLimitError(
                    f"the chat template takes over {RENDER_SECONDS:g} s to render a {turns}-turn conversation; a "
                    "template must not loop that long") from None
            except EOFError:  # the child died: out of its memory, in a way Python could not report
                self._stop()
                raise TemplateLimitError(self._memory_message(turns)) from None
            self._template = template
        if "texts" in answer:
            return [str(text) for text in answer["texts"]]
        if "error" in answer:
            raise TemplateRenderError(str(answer["error"]))
        if answer.get("memory"):
            raise TemplateLimitError(self._memory_message(turns))
        index, chars = answer["too_long"]
        raise TemplateLimitError(
            f"the chat template renders {chars:,} characters from a {turns}-turn conversation, more than twice its "
            f"text plus {RENDER_SLACK_CHARS:,} ({request['max_chars'][index]:,}); a template must not swell its text")

    def _memory_message(self, turns: int) -> str:
        return (f"the chat template cannot render a {turns}-turn conversation within {self._memory >> 20:,} MiB of "
                "memory; a template must not build text without end")

    def _running(self) -> subprocess.Popen[bytes]:
        child = self._child
        if child is not None and (self._owner != os.getpid() or self._memory != RENDER_MEMORY_BYTES
                                  or child.poll() is not None):
            self._stop()
            child = None
        if child is None:
            child = subprocess.Popen(
                [sys.executable, "-m", "worker.engine.template_sandbox", str(RENDER_MEMORY_BYTES)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
            self._child, self._owner, self._memory, self._template = child, os.getpid(), RENDER_MEMORY_BYTES, None
            try:
                self._read(child, START_SECONDS)
            except (TimeoutError, EOFError):
                self._stop()
                raise SandboxStartError(f"the chat template sandbox did not start within {START_SECONDS:g} s") from None
        return child

    def _ask(self, child: subprocess.Popen[bytes], line: bytes) -> dict[str, Any]:
        """Send `line`, read the one-line answer; TimeoutError past `RENDER_SECONDS`, EOFError if it dies."""
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(line)
            child.stdin.flush()
        except BrokenPipeError:
            raise EOFError from None
        return self._read(child, RENDER_SECONDS)

    @staticmethod
    def _read(child: subprocess.Popen[bytes], seconds: float) -> dict[str, Any]:
        """The child's next one-line answer; TimeoutError past `seconds`, EOFError if it dies."""
        assert child.stdout is not None
        deadline = time.monotonic() + seconds
        out, chunks = child.stdout.fileno(), []
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(out, 1 << 20)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                return json.loads(b"".join(chunks))

    def _stop(self) -> None:
        if self._owner == os.getpid() and self._child is not None:
            self._child.kill()
            self._child.wait()
            for stream in (self._child.stdin, self._child.stdout):
                if stream is not None:
                    stream.close()
        self._child, self._template = None, None


SANDBOX = Sandbox()  # this process's: the child starts at the first rendering, and ends with the process


def render(template: str, tokens: Mapping[str, Any], renders: Sequence[Render]) -> list[str]:
    """`Sandbox.render` in this process's sandbox."""
    return SANDBOX.render(template, tokens, renders)


def render_here(template: str, tokens: Mapping[str, Any], messages: Sequence[Message], *,
                add_generation_prompt: bool) -> str:
    """One rendering in this process, as ``apply_chat_template`` does it: for templates that are not a user's
    (the built-in ChatML), and in the child."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[list(messages)], chat_template=template,
                                        add_generation_prompt=add_generation_prompt, **tokens)
    return rendered[0]


def _serve(memory_bytes: int) -> None:
    """The child: answer requests from stdin until it closes, within `memory_bytes` of address space."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    from transformers.utils import chat_template_utils  # noqa: F401  imported before the first request's clock

    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    template = ""
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            template = request.get("template", template)
            answer = _answer(template, request)
        except MemoryError:
            answer = {"memory": True}
        except Exception as error:  # Jinja's errors (syntax, sandbox, raise_exception) have no common base
            answer = {"error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def _answer(template: str, request: Mapping[str, Any]) -> dict[str, Any]:
    texts = []
    for index, ((messages, agp), limit) in enumerate(zip(request["renders"], request["max_chars"], strict=True)):
        text = render_here(template, request["tokens"], messages, add_generation_prompt=agp)
        if len(text) > limit:
            return {"too_long": [index, len(text)]}
        texts.append(text)
    return {"texts": texts}


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
