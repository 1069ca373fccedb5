"""A dataset is a team's text corpus, or file of instruction or chat data, plus the tokenizer trained on it and
its token ids: token blocks of the corpus, or the examples of the instruction data.

The file is stored when it is uploaded; the tokenizer and the token ids follow from the web worker
(``tokenizing`` until then, ``ready`` or ``failed`` after).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import ClassVar

from django.conf import settings
from django.db import models

from webapp.accounts.models import Team
from webapp.background.models import WebWork
from webapp.datasets.tokenization import split_sizes
from webapp.worker_door import TOKENIZER_JSON


def datasets_root() -> Path:
    """Where dataset files live: ``<HYDRA_DATA_DIR>/datasets/<storage_key>/``."""
    return settings.HYDRA.data_dir / "datasets"


class Dataset(WebWork):
    class Source(models.TextChoices):
        UPLOAD = "upload", "Uploaded file"
        IMPORT = "import", "File in the server's import folder"
        SAMPLE = "sample", "Built-in sample corpus"
        SAMPLE_CHAT = "sample_chat", "Built-in sample chat data"
        SAMPLE_PAIRS = "sample_pairs", "Built-in sample preference pairs"

    class Kind(models.TextChoices):
        """A plain text corpus (token blocks), instruction data of one `records.Kind` (examples), or preference
        pairs (a prompt with a chosen and a rejected answer; its example set is a pair set, see
        `worker.engine.pairs`, and ``train_examples``, ``n_examples`` count pairs)."""

        CORPUS = "corpus", "Text corpus"
        TEXT = "text", "Text rows"
        PROMPT_COMPLETION = "prompt_completion", "Prompt and completion"
        ALPACA = "alpaca", "Alpaca instructions"
        MESSAGES = "messages", "Chat messages"
        PREFERENCE = "preference", "Preference pairs"

    class Status(models.TextChoices):
        TOKENIZING = "tokenizing", "Tokenizing…"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    PENDING = Status.TOKENIZING
    TASK: ClassVar[str] = "hydra.web.dataset_tokenize"
    RETRY_HINT = "The corpus is kept; delete the dataset and upload it again once the web worker runs."
    CORPUS_FILE = "corpus.txt"
    TOKENIZER_FILE = TOKENIZER_JSON  # the engine's name for a tokenizer directory's tokenizer
    TOKENS_FILE = "tokens.npy"
    TOKEN_BYTES_FILE = "token_bytes.npy"
    SOURCE_STEM = "source"
    RECORDS_FILE = "records.jsonl"
    BAD_ROWS_FILE = "bad_rows.json"
    EXAMPLES_DIR = "examples"
    PREVIEW_FILE = "preview.json"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=120)
    source = models.CharField(max_length=12, choices=Source.choices)
    kind = models.CharField(
        max_length=20, choices=Kind.choices, default=Kind.CORPUS,
        help_text="A text corpus (token blocks), the kind of rows of an instruction or chat data file, or "
                  "preference pairs.")
    columns = models.JSONField(
        default=dict, blank=True,
        help_text="Instruction data: the column of each role of its kind ({role: column}), given or detected.")
    filename = models.CharField(max_length=255, blank=True,
                                help_text="The uploaded file's name, or its path in the import folder, if any.")
    status = models.CharField(
        max_length=12, choices=Status.choices, default=Status.TOKENIZING,
        help_text="The web worker trains the tokenizer after the upload; experiments use ready datasets only.",
    )
    message = models.TextField(blank=True, help_text="Why tokenizing failed, for the UI.")
    vocab_size = models.PositiveIntegerField(
        help_text="Tokens in the trained tokenizer's vocabulary (the size asked for, until it is trained).")
    val_fraction = models.FloatField(
        help_text="Fraction of the corpus's UTF-8 bytes (its tail, from a line start) held out for validation.")
    n_bytes = models.BigIntegerField()
    n_tokens = models.BigIntegerField(default=0, help_text="0 until the corpus is tokenized.")
    n_rows = models.PositiveIntegerField(default=0, help_text="Instruction data: rows read, good and bad.")
    n_examples = models.PositiveIntegerField(
        default=0, help_text="Instruction data: the examples tokenized, training and validation.")
    n_bad_rows = models.PositiveIntegerField(
        default=0, help_text="Instruction data: rows that are no example (unreadable, or refused by the template).")
    train_examples = models.PositiveIntegerField(
        default=0, help_text="Instruction data: the examples of the training split (the first ones of the set).")
    fingerprint = models.CharField(
        max_length=64, db_index=True,
        help_text="sha256 of the corpus, vocabulary size and split: equal fingerprints are comparable results.",
    )
    corpus_sha256 = models.CharField(
        max_length=64, blank=True, db_index=True,
        help_text="sha256 of the corpus alone: with the split, what the cross-team board matches on.")
    val_offset = models.BigIntegerField(
        null=True, blank=True,
        help_text="UTF-8 byte offset where the validation text begins (a line start), the same for every tokenizer; "
                  "null until tokenized (and for datasets split by blocks of tokens).")
    val_start = models.BigIntegerField(null=True, blank=True, help_text="Index of the validation text's first token.")
    storage_key = models.CharField(max_length=32, unique=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "-pk"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="unique_dataset_name_per_team")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_ready(self) -> bool:
        return self.status == self.Status.READY

    @property
    def is_instruction(self) -> bool:
        """Instruction or chat data (examples), rather than a text corpus (token blocks)."""
        return self.kind != self.Kind.CORPUS

    @property
    def is_preference(self) -> bool:
        """Preference pairs, which train with DPO; also `is_instruction` (examples rendered with a chat template)."""
        return self.kind == self.Kind.PREFERENCE

    @property
    def val_examples(self) -> int:
        return self.n_examples - self.train_examples

    @property
    def directory(self) -> Path:
        return datasets_root() / self.storage_key

    @classmethod
    def stored_name(cls, kind: str, filename: str) -> str:
        """The name a dataset's file is stored under: the corpus's, or for instruction data ``source`` with the
        suffix of `filename` (``source.jsonl``), which says its format."""
        return cls.CORPUS_FILE if kind == cls.Kind.CORPUS else f"{cls.SOURCE_STEM}{Path(filename).suffix.lower()}"

    @property
    def source_path(self) -> Path:
        """The instruction data file as uploaded (`stored_name`)."""
        return self.directory / self.stored_name(self.kind, self.filename)

    @property
    def records_path(self) -> Path:
        """The examples, normalized, one JSON object a line (``{"line", "text", "messages"}``), in split order:
        the training examples, then the validation ones, each part in file order."""
        return self.directory / self.RECORDS_FILE

    @property
    def bad_rows_path(self) -> Path:
        """The first bad rows as ``[line, reason]`` pairs (all of them are counted in ``n_bad_rows``)."""
        return self.directory / self.BAD_ROWS_FILE

    @property
    def examples_dir(self) -> Path:
        """The examples under the dataset's own tokenizer and the default chat template (an ``ExampleSet``)."""
        return self.directory / self.EXAMPLES_DIR

    @property
    def preview_path(self) -> Path:
        """What the detail page shows of instruction data, written by the web worker."""
        return self.directory / self.PREVIEW_FILE

    @property
    def tokens_path(self) -> Path:
        return self.directory / self.TOKENS_FILE

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / self.TOKENIZER_FILE

    @property
    def corpus_path(self) -> Path:
        return self.directory / self.CORPUS_FILE

    @property
    def token_bytes_path(self) -> Path:
        return self.directory / self.TOKEN_BYTES_FILE

    @property
    def val_bytes(self) -> int | None:
        """UTF-8 bytes of the validation text (None: split by blocks of tokens)."""
        return None if self.val_offset is None else self.n_bytes - self.val_offset

    @property
    def train_tokens(self) -> int:
        if self.val_start is not None:
            return self.val_start
        return split_sizes(self.n_tokens, self.val_fraction)[0]

    @property
    def val_tokens(self) -> int:
        if self.val_start is not None:
            return self.n_tokens - self.val_start
        return split_sizes(self.n_tokens, self.val_fraction)[1]


def template_sha256(chat_template: str) -> str:
    """Which chat template a `DatasetTokens` row renders with: its sha256, "" for none given."""
    return hashlib.sha256(chat_template.encode()).hexdigest() if chat_template else ""


class DatasetTokens(WebWork):
    """A dataset's corpus as the token ids of a pretrained model's tokenizer, so that a pretrained model trains
    on ids its embeddings know; for instruction data, its examples rendered with a chat template. One per
    dataset, tokenizer (its ``tokenizer_sha256``) and chat template, computed once by the web worker and shared
    by every experiment that trains that model on that dataset; deleted with the dataset (its files lie in the
    dataset's directory)."""

    class Status(models.TextChoices):
        TOKENIZING = "tokenizing", "Tokenizing…"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    PENDING = Status.TOKENIZING
    TASK: ClassVar[str] = "hydra.web.dataset_tokens_build"
    RETRY_HINT = "Launch the experiment again to retry."

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="token_sets")
    tokenizer_sha256 = models.CharField(max_length=64, help_text="Which tokenizer: its checkpoint's fingerprint.")
    tokenizer_dir = models.CharField(max_length=500, help_text="The directory holding its tokenizer.json.")
    model_name = models.CharField(max_length=200, help_text="The model whose tokenizer it is, for the pages.")
    chat_template = models.TextField(
        blank=True, help_text="Instruction data: the chat template; blank for the checkpoint's own, else ChatML.")
    template_sha256 = models.CharField(max_length=64, blank=True,
                                       help_text="sha256 of the chat template; blank for none given.")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.TOKENIZING)
    message = models.TextField(blank=True, help_text="Why tokenizing failed, for the UI.")
    n_tokens = models.BigIntegerField(default=0, help_text="0 until the corpus is tokenized.")
    max_id = models.BigIntegerField(default=0, help_text="The largest token id: a model needs more embeddings.")
    val_start = models.BigIntegerField(
        null=True, blank=True, help_text="Index of the token where the dataset's validation text begins.")
    train_examples = models.PositiveIntegerField(
        default=0, help_text="Instruction data: the examples of the training split (the first ones of the set).")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "tokenizer_sha256", "template_sha256"],
                                               name="unique_tokens_per_dataset_tokenizer_and_template")]

    def __str__(self) -> str:
        return f"{self.dataset} with {self.model_name}'s tokenizer"

    @property
    def is_ready(self) -> bool:
        return self.status == self.Status.READY

    @property
    def path(self) -> Path:
        return self.dataset.directory / f"tokens-{self.tokenizer_sha256[:32]}.npy"

    @property
    def token_bytes_path(self) -> Path:
        return self.dataset.directory / f"tokens-{self.tokenizer_sha256[:32]}.bytes.npy"

    @property
    def examples_dir(self) -> Path:
        """Instruction data: the examples under this tokenizer and template (an ``ExampleSet``)."""
        return self.dataset.directory / f"examples-{self.pk}"

    @property
    def train_tokens(self) -> int:
        if self.val_start is not None:
            return self.val_start
        return split_sizes(self.n_tokens, self.dataset.val_fraction)[0]
