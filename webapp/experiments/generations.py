"""Text generation with a finished trial's model: a prompt on the trial's page, continued by the web worker.
A model trained on instruction or chat data answers the prompt as a user's turn of its chat template.

`generation_request` (a page's POST) checks who asks and the settings, records the generation as pending and
sends `trial_generate` to the web worker (`webapp.background.outbox`); the page polls it until it is done or
failed. The model and tokenizer are loaded and run only in the web worker (transformers and torch are
imported inside `trial_generate`), never in the web process. Only a finished trial with an exported model
generates, and the generation belongs to that attempt: a trial retried or deleted meanwhile fails it with a
message. Generating again from a message delivered twice changes nothing: only a pending row is generated
for, and its result is written only while it is still pending. A model whose weights would not fit in the web
worker's free memory is refused with a message before it is loaded, so that one large model cannot take down
the worker (and, redelivered, take it down again).

A trial of instruction or chat data shows, once finished, how it answers a few held-out examples beside their
own answers: `held_out_request` (called when its finished event is applied) records a greedy generation for each
of the first `HELD_OUT_SHOWN` validation examples of the dataset's ``records.jsonl``, whose conversation before
its last answer is the prompt. The app asks for these, not a user: they do not count toward the team's pending
generations, and the ordinary list leaves them out (`held_out_list` lists them).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import psutil
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone

from webapp import worker_door
from webapp.accounts.models import Membership, Team
from webapp.background.outbox import work_enqueue
from webapp.datasets.models import Dataset
from webapp.experiments.archives import trial_model_dir
from webapp.experiments.export_tokenizer import fallback_files, has_tokenizer, model_context
from webapp.ground.models import Generation, Trial
from webapp.worker_door import END_OF_TEXT

MAX_PENDING_PER_TEAM = 4  # the web worker generates one at a time; more would hold up the team's other work
SHOWN = 20  # generations a trial's page lists
MEMORY_FACTOR = 2  # free memory a model needs, in multiples of its weights' bytes (loading copies them once)
HELD_OUT_SHOWN = 3  # held-out examples a finished chat trial answers on its page
HELD_OUT_NEW_TOKENS = 64  # a held-out answer's length, at most (fewer where the model's context ends first)
HELD_OUT_KINDS = (Dataset.Kind.MESSAGES, Dataset.Kind.PROMPT_COMPLETION, Dataset.Kind.ALPACA)  # text rows ask nothing
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    """What a generation is asked for (the form's cleaned data)."""

    prompt: str
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int


def generation_unavailable(trial: Trial) -> str:
    """Why `trial` cannot generate text, for its page; empty when it can."""
    if trial.status not in (Trial.Status.FINISHED, Trial.Status.PRUNED):
        return (f"Text generation needs a finished trial with an exported model; trial #{trial.number} is "
                f"{trial.get_status_display().lower()}.")
    if trial_model_dir(trial) is None:
        return f"Trial #{trial.number} has no exported model to generate with (it was not exported, or was deleted)."
    return ""


def generation_request(*, trial: Trial, actor: AbstractBaseUser, settings: Settings) -> Generation:
    """Record a pending generation by `actor` with `settings` and send it to the web worker.

    Raises PermissionDenied unless `actor` is in the trial's team, and ValidationError (by field where a field
    is at fault) for a trial that cannot generate, more new tokens than the model's context holds, or a team
    that already waits for `MAX_PENDING_PER_TEAM` generations (counted under a lock on the team's row, so two
    requests at once cannot both take the last place)."""
    team = trial.experiment.team
    if not actor.is_authenticated or not Membership.objects.filter(user=actor, team=team).exists():
        raise PermissionDenied("Only the trial's team can generate text with its model.")
    reason = generation_unavailable(trial)
    if reason:
        raise ValidationError(reason)
    directory = trial_model_dir(trial)
    assert directory is not None  # generation_unavailable said so
    context = model_context(directory)
    if context is not None and settings.max_new_tokens >= context:
        raise ValidationError({"max_new_tokens": f"This model reads at most {context} tokens at once: ask for "
                                                 f"fewer than {context} new tokens, to leave room for the prompt."})
    with transaction.atomic():
        # The team's row serialises its requests: a second one waits here until the first commits, then counts
        # the first's generation too. Locking the pending rows would not (PostgreSQL re-reads only the rows it
        # waited for, never the one the first request inserted, and with none pending there is nothing to lock).
        # A no-key lock: inserting rows that only point at the team (an experiment, a notice) does not wait on it.
        Team.objects.select_for_update(no_key=True).filter(pk=team.pk).values_list("pk").get()
        pending = Generation.objects.filter(trial__experiment__team=team, status=Generation.Status.PENDING,
                                            held_out_line__isnull=True).count()
        if pending >= MAX_PENDING_PER_TEAM:
            raise ValidationError(f"Your team already waits for {MAX_PENDING_PER_TEAM} generations; generate "
                                  f"again once one of them is done.")
        generation = Generation.objects.create(
            trial=trial, queue_id=trial.queue_id, prompt=settings.prompt, max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature, top_p=settings.top_p, seed=settings.seed, created_by=actor)
        work_enqueue(row=generation)
    return generation


def generation_list(*, trial: Trial) -> QuerySet[Generation]:
    """The trial's generations that users asked for, newest first (every attempt's), with who asked."""
    return trial.generations.filter(held_out_line__isnull=True).select_related("created_by").order_by(
        "-created", "-pk")


@dataclass(frozen=True)
class HeldOutExample:
    """A validation example to answer: its line in the dataset's file, its conversation before its last answer
    (ending with the turn the answer replies to), and that answer."""

    line: int
    messages: list[dict[str, str]]
    reference: str


def held_out_examples(*, dataset: Dataset, count: int) -> list[HeldOutExample]:
    """The first `count` validation examples of an instruction dataset that end in an answer: the rows of its
    ``records.jsonl`` after its first ``train_examples`` (the training ones), each cut before its last
    assistant turn. Every trial of the dataset holds these out: a pretrained tokenizer's `DatasetTokens`
    encodes the same rows in the same order (its own ``train_examples`` counts the training rows its template
    kept, not where the file's validation rows begin). Raises OSError, ValueError, LookupError or TypeError
    for a file that cannot be read as one row of ``{"line", "text", "messages"}`` a line."""
    found: list[HeldOutExample] = []
    with dataset.records_path.open(encoding="utf-8") as file:
        for raw in islice(file, dataset.train_examples, None):  # the training rows are skipped unparsed
            row = json.loads(raw)
            messages = row["messages"] or []
            last = max((k for k, m in enumerate(messages) if m["role"] == "assistant"), default=0)
            if last > 0:  # an answer with a turn before it to reply to
                found.append(HeldOutExample(line=row["line"], messages=messages[:last],
                                            reference=messages[last]["content"]))
            if len(found) == count:
                break
    return found


def held_out_request(*, trial: Trial) -> list[Generation]:
    """Record the answers of a finished trial's model to the first `HELD_OUT_SHOWN` held-out examples of its
    instruction dataset (greedy, `HELD_OUT_NEW_TOKENS` at most) and send them to the web worker; returns the
    new generations: none for a dataset of a kind without prompts (a corpus, text rows), a trial without an
    exported model, or an attempt that has its answers already.

    Call it in the transaction that records the trial finished, holding the trial's row lock (as
    `events.trial_event_apply` does), so that a finished event applied twice finds the first's answers; the
    unique constraint on (trial, attempt, line) refuses a second set anyway. A dataset file that cannot be read
    is logged and gives none: the trial's event must still apply."""
    dataset = trial.experiment.dataset
    if dataset.kind not in HELD_OUT_KINDS or trial_model_dir(trial) is None:
        return []
    if trial.generations.filter(queue_id=trial.queue_id, held_out_line__isnull=False).exists():
        return []
    try:
        examples = held_out_examples(dataset=dataset, count=HELD_OUT_SHOWN)
    except (OSError, ValueError, LookupError, TypeError) as error:  # never hold up this event, and those after it
        log.warning("no held-out answers for trial %s: %s cannot be read (%s: %s)", trial.pk,
                    dataset.records_path, type(error).__name__, error)
        return []
    created = []
    for example in examples:
        question = next((m["content"] for m in reversed(example.messages) if m["role"] == "user"),
                        example.messages[-1]["content"])
        generation = Generation.objects.create(
            trial=trial, queue_id=trial.queue_id, prompt=question, messages=example.messages,
            reference=example.reference, held_out_line=example.line, max_new_tokens=HELD_OUT_NEW_TOKENS,
            temperature=0.0, top_p=1.0, seed=0)
        work_enqueue(row=generation)
        created.append(generation)
    return created


@dataclass(frozen=True)
class HeldOutAnswer:
    """A held-out answer for the trial's page: the generation (its ``prompt`` is the conversation's last user
    message) and how many turns of the conversation come before that message (not shown)."""

    generation: Generation
    earlier_turns: int


def held_out_list(*, trial: Trial) -> list[HeldOutAnswer]:
    """The held-out answers of the trial's current attempt, in the dataset's order (an earlier attempt's model
    is gone: its answers are not this model's)."""
    rows = trial.generations.filter(queue_id=trial.queue_id, held_out_line__isnull=False).order_by("held_out_line")
    return [HeldOutAnswer(generation=g, earlier_turns=len(g.messages or []) - 1) for g in rows]


def generation_get(*, trial: Trial, generation_id: int) -> Generation:
    """One of the trial's generations; Http404 for any other (the trial is already the team's)."""
    return get_object_or_404(Generation.objects.select_related("created_by"), trial=trial, pk=generation_id)


def trial_generate(*, generation_id: int) -> None:
    """Generate the text of a pending generation with its trial's model: it becomes done, or failed with a
    message. Runs in the web worker."""
    generation = Generation.objects.filter(pk=generation_id, status=Generation.Status.PENDING).select_related(
        "trial__experiment__dataset").first()
    if generation is None:
        return
    pending = Generation.objects.filter(pk=generation_id, status=Generation.Status.PENDING)
    trial = generation.trial
    directory = trial_model_dir(trial)
    if directory is None or trial.queue_id != generation.queue_id:
        pending.update(status=Generation.Status.FAILED, finished=timezone.now(),
                       message="The trial's model is gone (deleted or retried).")
        return
    try:
        text = _generate(generation, directory)
    except GenerationError as error:
        pending.update(status=Generation.Status.FAILED, finished=timezone.now(), message=str(error))
        return
    except Exception as error:  # a model that does not load or run: say so on the page, keep the worker alive
        log.exception("generating with the model of trial %s failed", trial.pk)
        pending.update(status=Generation.Status.FAILED, finished=timezone.now(),
                       message=f"Generating failed: {type(error).__name__}: {error}")
        return
    pending.update(status=Generation.Status.DONE, text=text, finished=timezone.now(), message="")


class GenerationError(Exception):
    """A generation that cannot be done as asked; its message is for the user."""


def _generate(generation: Generation, directory: Path) -> str:
    """The continuation of the generation's prompt, or the answer to its conversation, by the model in
    `directory` (on the CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    weights = sum(path.stat().st_size for path in directory.glob("*.safetensors"))
    available = psutil.virtual_memory().available
    if weights * MEMORY_FACTOR > available:
        raise GenerationError(
            f"The model's weights ({weights / 2**30:.1f} GiB) would not fit in the web worker's free memory "
            f"({available / 2**30:.1f} GiB) with room to run: download it and generate where it fits.")
    tokenizer = _load_tokenizer(generation.trial, directory)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    encoded = _encoded_prompt(generation, tokenizer)
    n_prompt = int(encoded["input_ids"].shape[1])
    if n_prompt == 0:
        raise GenerationError("The prompt made no tokens: write some text to continue.")
    context = model_context(directory)
    max_new_tokens = generation.max_new_tokens
    if context is not None and generation.held_out_line is not None:
        if n_prompt >= context:
            raise GenerationError(f"The held-out conversation is {n_prompt} tokens: this model reads at most "
                                  f"{context} at once, which leaves no room for an answer.")
        max_new_tokens = min(max_new_tokens, context - n_prompt)  # nobody chose it: the answer takes the room left
    if context is not None and n_prompt + max_new_tokens > context:
        raise GenerationError(
            f"The prompt is {n_prompt} tokens, and with {generation.max_new_tokens} new tokens that is more than "
            f"the {context} tokens this model reads at once: shorten the prompt or ask for fewer new tokens.")
    end = _end_of_text(tokenizer)
    sampling: dict[str, Any] = (
        {"do_sample": False} if generation.is_greedy
        else {"do_sample": True, "temperature": generation.temperature, "top_p": generation.top_p, "top_k": 0})
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=end,
                              pad_token_id=end if end is not None else 0, **sampling)
    torch.manual_seed(generation.seed)
    with torch.no_grad():
        output = model.generate(**encoded, generation_config=config)
    return str(tokenizer.decode(output[0, n_prompt:], skip_special_tokens=True))  # a NUL in it: `webapp.nul_text`


def _encoded_prompt(generation: Generation, tokenizer: Any) -> Any:
    """The prompt's token ids (a ``BatchEncoding`` of one row). A conversation (a held-out example's turns, or
    for a model tuned on chats the prompt as a user's turn) is rendered with the tokenizer's chat template, the
    one the model was trained with, up to the opening of the assistant's answer; other text is read as it is.
    Raises GenerationError for a conversation and a tokenizer without a template, or a template that fails on it
    or passes the rendering limits (`worker.engine.template_sandbox`)."""
    messages = generation.messages
    if messages is None and generation.trial.experiment.dataset.is_instruction and tokenizer.chat_template:
        messages = [{"role": "user", "content": generation.prompt}]
    if messages is None:
        return tokenizer(generation.prompt, return_tensors="pt")
    if not tokenizer.chat_template:
        raise GenerationError("The model's tokenizer has no chat template to render the conversation with.")
    try:  # under the rendering limits, as every rendering of a template a user or a checkpoint brought
        text = worker_door.render(tokenizer, messages, add_generation_prompt=True)
    except (worker_door.TemplateError, worker_door.TemplateLimitError) as error:
        raise GenerationError(f"The model's chat template cannot render this conversation: {error}.") from None
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)  # the template wrote its own


def _end_of_text(tokenizer: Any) -> int | None:
    """The token that ends a text: the tokenizer's end-of-sequence token, else the dataset tokenizers' own
    ``<|endoftext|>`` (a bare ``tokenizer.json`` saved as it is names no end-of-sequence token)."""
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    token = tokenizer.get_vocab().get(END_OF_TEXT)
    return int(token) if token is not None else None


def _load_tokenizer(trial: Trial, directory: Path) -> Any:
    """The export's own tokenizer, or for an export without one the tokenizer its tokens were made with."""
    from transformers import AutoTokenizer

    if has_tokenizer(directory):
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)
    files = fallback_files(trial, context=model_context(directory))
    if not files:
        raise GenerationError("The model has no tokenizer, and its dataset's tokenizer is gone: it cannot read a "
                              "prompt.")
    scratch = Path(tempfile.mkdtemp(prefix="hydra-tokenizer-"))
    try:
        for name, content in files.items():
            (scratch / name).write_bytes(content)
        return AutoTokenizer.from_pretrained(scratch, local_files_only=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
