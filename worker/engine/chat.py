"""Conversations as a model sees them: the chat template, the tokens, and which tokens a trial trains on.

A conversation is a sequence of ``{"role", "content"}`` messages (roles ``system``, ``user``, ``assistant``).
Its text is the chat template's rendering, through ``transformers``' own rendering (a sandboxed Jinja
environment, as ``apply_chat_template`` uses), so a fine-tuned model is trained on exactly the prompt the
checkpoint's users will send it. Which template: the experiment's own when it sets one, else the checkpoint
tokenizer's, else :data:`DEFAULT_CHAT_TEMPLATE` (ChatML, the format of SmolLM2 and Qwen). Any template but
ChatML, which is ours, is rendered in a process of its own under a time and a memory limit
(:mod:`worker.engine.template_sandbox`): every rendering, the check's and each example's, whoever asks.

Every token gets one mark (:data:`PROMPT`, :data:`ANSWER`, :data:`LAST_ANSWER`), so a tokenized dataset serves
every ``loss_on`` a sweep tries: ``assistant`` trains on every assistant turn, ``last`` on the last one only,
``all`` on every token. An assistant turn's span is found by rendering the conversation's prefixes: the text
from the end of "the turns before it, plus the generation prompt" to the end of "the turns up to it". It so
holds the answer and the template's end-of-turn text (``<|im_end|>`` in ChatML), which a model must learn to
produce in order to stop. A token is in a span when any of its characters is: a template whose generation
prompt ends with a space (``[/INST] ``) leaves that space to the answer's first word (`` Paris``), and the
answer is that token.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import numpy as np
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from worker.engine import template_sandbox
from worker.engine.errors import SpecError
from worker.engine.template_sandbox import Render, TemplateLimitError, TemplateRenderError

ROLES = ("system", "user", "assistant")
CHAT_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MAX_TEMPLATE_CHARS = 64 * 1024

PROMPT = 0  # template text, system and user turns: never trained unless loss_on is "all"
ANSWER = 1  # an assistant turn before the last
LAST_ANSWER = 2  # the conversation's last assistant turn

Message = dict[str, str]


class LossOn(StrEnum):
    """Which tokens of an example the loss covers."""

    ASSISTANT = "assistant"
    LAST = "last"
    ALL = "all"


class TemplateError(SpecError):
    """A chat template that does not compile, does not render a conversation, or renders a conversation's
    earlier turns differently once later turns follow (so no turn's span can be found)."""


PROBE: tuple[Message, ...] = (
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And three plus three?"},
    {"role": "assistant", "content": "Six."},
)


def chat_tokenizer(tokenizer: Tokenizer | PreTrainedTokenizerBase, *, template: str | None = None
                   ) -> PreTrainedTokenizerBase:
    """`tokenizer` with the chat template it renders with: `template` when given, else its own, else
    :data:`DEFAULT_CHAT_TEMPLATE`. A bare ``tokenizers.Tokenizer`` (a dataset's own BPE) is wrapped.
    Raises TemplateError when the template fails :func:`check_template`."""
    if isinstance(tokenizer, Tokenizer):
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    chosen = template or getattr(tokenizer, "chat_template", None) or DEFAULT_CHAT_TEMPLATE
    if not isinstance(chosen, str):  # a dict of named templates: the default one is the chat template
        chosen = chosen.get("default") or DEFAULT_CHAT_TEMPLATE
    if chosen != getattr(tokenizer, "chat_template", None):
        tokenizer = _copy_with_template(tokenizer, chosen)
    check_template(tokenizer)
    return tokenizer


def _copy_with_template(tokenizer: PreTrainedTokenizerBase, template: str) -> PreTrainedTokenizerBase:
    """A tokenizer like `tokenizer` rendering with `template`; the caller's object is left as it was."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"the chat template has {len(template)} characters; at most {MAX_TEMPLATE_CHARS}")
    copy = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer,
                                   bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                                   pad_token=tokenizer.pad_token, unk_token=tokenizer.unk_token)
    copy.chat_template = template
    return copy


def check_template_text(template: str) -> None:
    """Check `template` alone, as :func:`chat_tokenizer` checks it for a tokenizer (rendering needs no
    vocabulary). Raises TemplateError, or TemplateLimitError past the rendering limits."""
    chat_tokenizer(Tokenizer(models.BPE()), template=template)


def check_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Render :data:`PROBE` with `tokenizer`'s template and find every assistant span in it; raises
    TemplateError with the template's own message when it fails."""
    encode_conversation(tokenizer, PROBE)


def render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], *,
           add_generation_prompt: bool = False) -> str:
    """The conversation's text under `tokenizer`'s chat template. Raises TemplateError, and TemplateLimitError
    for a template past the rendering limits."""
    return render_many(tokenizer, [(messages, add_generation_prompt)])[0]


def render_many(tokenizer: PreTrainedTokenizerBase, renders: Sequence[Render]) -> list[str]:
    """The text of each (conversation, add_generation_prompt) of `renders` under `tokenizer`'s chat template:
    ChatML here, any other template in the sandbox, all of `renders` within one request's limits. Raises
    TemplateError, and TemplateLimitError for a template past the rendering limits."""
    try:
        template = tokenizer.get_chat_template()
    except ValueError as error:  # the tokenizer has none
        raise TemplateError(f"the chat template fails: {error}") from None
    tokens = dict(tokenizer.special_tokens_map)
    try:
        if template == DEFAULT_CHAT_TEMPLATE:
            return [template_sandbox.render_here(template, tokens, list(messages), add_generation_prompt=agp)
                    for messages, agp in renders]
        return template_sandbox.render(template, tokens, renders)
    except TemplateLimitError:
        raise
    except TemplateRenderError as error:
        raise TemplateError(f"the chat template fails: {error}") from None
    except Exception as error:  # Jinja's errors (syntax, sandbox, raise_exception) have no common base
        raise TemplateError(f"the chat template fails: {type(error).__name__}: {error}") from error


def answer_spans(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text and the (start, end) character span of each assistant turn in it."""
    turns = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
    renders: list[Render] = [(messages, False)]  # then, for each turn: the turns before it (if any), through it
    for index in turns:
        renders += [(messages[:index], True)] * bool(index) + [(messages[: index + 1], False)]
    rendered = iter(render_many(tokenizer, renders))
    text, spans = next(rendered), []
    for index in turns:
        before = next(rendered) if index else ""
        through = next(rendered)
        if not (text.startswith(through) and through.startswith(before)):
            raise TemplateError(
                f"the chat template renders turns 1-{index} differently once turn {index + 1} follows, so the "
                "assistant's tokens cannot be found; train with loss_on 'all' or choose another template")
        spans.append((len(before), len(through)))
    return text, spans


def encode_conversation(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(ids, marks): the rendered conversation's token ids (int32) and each token's mark (uint8: PROMPT,
    ANSWER or LAST_ANSWER). The template supplies any beginning-of-sequence text, so the tokenizer adds none."""
    text, spans = answer_spans(tokenizer, messages)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(encoding["input_ids"], dtype=np.int32)
    offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)  # (N, 2) characters
    marks = np.full(len(ids), PROMPT, dtype=np.uint8)
    for number, (begin, end) in enumerate(spans):
        inside = (offsets[:, 0] < end) & (offsets[:, 1] > begin)
        marks[inside] = LAST_ANSWER if number == len(spans) - 1 else ANSWER
    return ids, marks


def trained(marks: np.ndarray, loss_on: LossOn | str) -> np.ndarray:
    """A bool per token: does the loss cover it under `loss_on`."""
    match LossOn(loss_on):
        case LossOn.ALL:
            return np.ones(marks.shape, dtype=bool)
        case LossOn.ASSISTANT:
            return marks != PROMPT
        case LossOn.LAST:
            return marks == LAST_ANSWER
