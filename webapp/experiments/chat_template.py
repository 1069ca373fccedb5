"""The chat template an experiment's instruction data is rendered with, as the web app checks and names it.

The engine renders conversations and finds their assistant turns (`worker.engine.chat`); this module asks it
through `webapp.worker_door`, which imports it when first asked, since it loads ``transformers``, which the
web process must not load when it starts. It also reads whether a checkpoint's tokenizer carries a template
of its own, from its files alone (the engine's size-capped, link-refusing reads), without loading the
tokenizer.

A template is checked by the web worker, never in a request (rendering it takes seconds, up to the
rendering limits): `chat_template_verdict` answers with the verdict kept for the template's text (by its
SHA-256, whoever asked first) or sends the check (`chat_template_check`), which the form then waits for.
The check renders the engine's probe conversation under the same limits as every later rendering of the
template (`worker.engine.template_sandbox`); those limits, not the check, are what keep a template that
passes it from hanging a dataset's build or a generation later.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from webapp import worker_door
from webapp.background.outbox import work_enqueue
from webapp.datasets.models import Dataset, template_sha256
from webapp.experiments.model_shapes import ModelShape
from webapp.ground.models import ChatTemplateCheck
from webapp.worker_door import (
    RENDER_MEMORY_BYTES,
    RENDER_SECONDS,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON_MAX_BYTES,
    CheckpointError,
    TemplateLimitError,
    checkpoint_file,
    read_limited,
)

TEMPLATE_FILE = "chat_template.jinja"  # where transformers saves a tokenizer's template since 4.49
NAMED_TEMPLATES_DIR = "additional_chat_templates"  # ... and its other named templates, one .jinja file each
CHECK_TTL = timedelta(days=30)  # a verdict is kept this long after it was asked for; then checked anew
Status = ChatTemplateCheck.Status
log = logging.getLogger(__name__)


def pending_message() -> str:
    """What the form says while the web worker checks a template."""
    return (f"The web worker is checking this chat template: it renders a sample conversation with it, within "
            f"{RENDER_SECONDS:g} s and {RENDER_MEMORY_BYTES >> 30} GiB of memory. Submit again in a few seconds.")


def chat_template_verdict(template: str) -> ChatTemplateCheck:
    """The check of `template`: its verdict (``ok`` or ``refused``, with why) when it was checked, else the
    check it waits for (``checking``), sent to the web worker now when there was none, the last was not done
    (``failed``), or its send could not reach Redis. Never renders in the calling process."""
    digest = template_sha256(template)
    check, created = ChatTemplateCheck.objects.get_or_create(digest=digest, defaults={"template": template})
    unsent = check.status == Status.CHECKING and bool(check.send_error)
    if not (created or unsent or check.status == Status.FAILED):
        return check
    if check.status == Status.FAILED:
        check.status, check.message, check.template = Status.CHECKING, "", template
        check.save(update_fields=["status", "message", "template"])
    work_enqueue(row=check)
    return check


def chat_template_check(*, check_id: int) -> None:
    """Check a template waiting for its check (the web worker's task): it becomes ``ok``, or ``refused`` with
    the engine's reason (a template that fails, hides its turns, or passes a rendering limit). Verdicts asked
    for longer than `CHECK_TTL` ago are deleted first."""
    ChatTemplateCheck.objects.filter(created__lt=timezone.now() - CHECK_TTL).exclude(
        status=Status.CHECKING).delete()
    check = ChatTemplateCheck.objects.filter(pk=check_id, status=Status.CHECKING).first()
    if check is None:
        return
    pending = ChatTemplateCheck.objects.filter(pk=check_id, status=Status.CHECKING)
    try:
        worker_door.check_template_text(check.template)
    except (worker_door.TemplateError, TemplateLimitError) as error:
        pending.update(status=Status.REFUSED, message=str(error), template="", checked=timezone.now())
        return
    except Exception as error:  # the form must not wait for ever; the worker's log has the trace
        log.exception("checking chat template %s failed", check.digest)
        pending.update(status=Status.FAILED, message=f"The check stopped on an unexpected error ({error}). "
                                                     "Submit again to retry.")
        raise
    pending.update(status=Status.OK, template="", checked=timezone.now())


def default_chat_template() -> str:
    """ChatML, the template the engine renders with when neither the experiment nor the tokenizer has one
    (a dataset's own tokenizer never has one)."""
    return worker_door.DEFAULT_CHAT_TEMPLATE


def has_own_template(tokenizer_dir: Path) -> bool:
    """Whether the pretrained tokenizer in `tokenizer_dir` renders chats with a template of its own, as
    ``AutoTokenizer`` loads it and the engine picks it (`worker.engine.chat.chat_tokenizer`): a
    ``chat_template.jinja``, a ``default`` named template, or a ``chat_template`` in its
    ``tokenizer_config.json`` (a text, or a list of named templates with a ``default``). A file that cannot
    be read (too large, a link out of the directory, not JSON) counts as no template."""
    try:
        if checkpoint_file(tokenizer_dir, TEMPLATE_FILE).is_file():
            return True
        if checkpoint_file(tokenizer_dir, f"{NAMED_TEMPLATES_DIR}/default.jinja").is_file():
            return True
        config = json.loads(read_limited(checkpoint_file(tokenizer_dir, TOKENIZER_CONFIG),
                                         limit=TOKENIZER_JSON_MAX_BYTES))
    except (CheckpointError, ValueError):
        return False
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        return any(isinstance(t, dict) and t.get("name") == "default" and t.get("template") for t in template)
    return isinstance(template, str) and bool(template)


def template_refusal(*, dataset: Dataset, shape: ModelShape, chat_template: str) -> str | None:
    """Why `chat_template` cannot render `dataset` for the trials of a `shape` model (None when it can, or when
    no template is set): a text corpus has no conversations, and a model trained from scratch trains on the
    dataset's own examples, rendered once with ChatML when the dataset was built."""
    if not chat_template:
        return None
    if not dataset.is_instruction:
        return (f"A chat template renders conversations: it applies to instruction and chat datasets, and "
                f"{dataset.name} is a text corpus. Leave chat_template empty.")
    if shape.pretrained_dir is None:
        return ("A model trained from scratch uses the dataset's ChatML rendering; templates apply to pretrained "
                "checkpoints. Leave chat_template empty, or choose a checkpoint.")
    return None
