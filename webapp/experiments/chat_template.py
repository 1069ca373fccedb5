"""The chat template an experiment's instruction data is rendered with, as the web app checks and names it.

The engine renders conversations and finds their assistant turns (`worker.engine.chat`); this module asks it
through `webapp.worker_door`, which imports it when first asked, since it loads ``transformers``, which the
web process must not load when it starts; a template's check runs it in a child process of its own. It also
reads whether a checkpoint's tokenizer carries a template of its own, from its files alone (the engine's
size-capped, link-refusing reads), without loading the tokenizer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from webapp import worker_door
from webapp.datasets.models import Dataset
from webapp.experiments.model_shapes import ModelShape
from webapp.worker_door import (
    TOKENIZER_CONFIG,
    TOKENIZER_JSON_MAX_BYTES,
    CheckpointError,
    checkpoint_file,
    read_limited,
)

TEMPLATE_FILE = "chat_template.jinja"  # where transformers saves a tokenizer's template since 4.49
NAMED_TEMPLATES_DIR = "additional_chat_templates"  # ... and its other named templates, one .jinja file each


class ChatTemplateError(ValueError):
    """A chat template the engine cannot train with; the message says why, in the engine's words."""


CHECK_SECONDS = 20  # a template's check renders a five-turn conversation: far less than this, unless it loops
CHECK_MEMORY_BYTES = 2 << 30  # the checking process's address space; a template rendering gigabytes stops there
CHECK_SCRIPT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from tokenizers import Tokenizer, models
from worker.engine.chat import TemplateError, chat_tokenizer
try:
    chat_tokenizer(Tokenizer(models.BPE()), template=sys.stdin.read())  # rendering needs no vocabulary
except TemplateError as error:
    print(error, end="")
    sys.exit(1)
"""


def check_chat_template(template: str) -> None:
    """Compile `template`, render the engine's probe conversation with it (system, user and assistant turns,
    twice) and find each assistant turn's span, as the engine does before it trains. Raises ChatTemplateError
    for a template over the engine's size limit, a syntax error, a sandbox violation, an exception the
    template raises, or earlier turns that render differently once later turns follow.

    The check runs in a process of its own, limited in time and memory: Jinja's sandbox bounds each ``range``
    but not loops nested in loops, and a request must not hang on what a user typed."""
    try:
        result = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(CHECK_MEMORY_BYTES)], input=template,
                                capture_output=True, text=True, timeout=CHECK_SECONDS,
                                cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired:
        raise ChatTemplateError(f"the chat template takes over {CHECK_SECONDS} s to render a five-turn "
                                "conversation; a template must not loop that long") from None
    if result.returncode == 1 and result.stdout:
        raise ChatTemplateError(result.stdout)
    if result.returncode != 0:
        raise ChatTemplateError("the chat template cannot be rendered within "
                                f"{CHECK_MEMORY_BYTES >> 30} GiB of memory: {result.stderr.strip()[-300:]}")


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
