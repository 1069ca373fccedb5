"""A dataset is a team's text corpus plus the tokenizer trained on it and the corpus as token ids.

The corpus is stored when it is uploaded; the tokenizer and the token ids follow from the web worker
(``tokenizing`` until then, ``ready`` or ``failed`` after).
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import models

from webapp.accounts.models import Team
from webapp.background.models import WebWork
from webapp.datasets.tokenization import split_sizes


def datasets_root() -> Path:
    """Where dataset files live: ``<HYDRA_DATA_DIR>/datasets/<storage_key>/``."""
    return settings.HYDRA.data_dir / "datasets"


class Dataset(WebWork):
    class Source(models.TextChoices):
        UPLOAD = "upload", "Uploaded corpus"
        SAMPLE = "sample", "Built-in sample corpus"

    class Status(models.TextChoices):
        TOKENIZING = "tokenizing", "Tokenizing…"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    PENDING = Status.TOKENIZING
    RETRY_HINT = "The corpus is kept; delete the dataset and upload it again once the web worker runs."
    CORPUS_FILE = "corpus.txt"
    TOKENIZER_FILE = "tokenizer.json"
    TOKENS_FILE = "tokens.npy"
    TOKEN_BYTES_FILE = "token_bytes.npy"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=120)
    source = models.CharField(max_length=10, choices=Source.choices)
    filename = models.CharField(max_length=255, blank=True, help_text="The uploaded file's name, if any.")
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
    def directory(self) -> Path:
        return datasets_root() / self.storage_key

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


class DatasetTokens(WebWork):
    """A dataset's corpus as the token ids of a pretrained model's tokenizer, so that a pretrained model trains
    on ids its embeddings know. One per dataset and tokenizer (its ``tokenizer_sha256``), computed once by the
    web worker and shared by every experiment that trains that model on that dataset; deleted with the dataset
    (its file lies in the dataset's directory)."""

    class Status(models.TextChoices):
        TOKENIZING = "tokenizing", "Tokenizing…"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    PENDING = Status.TOKENIZING
    RETRY_HINT = "Launch the experiment again to retry."

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="token_sets")
    tokenizer_sha256 = models.CharField(max_length=64, help_text="Which tokenizer: its checkpoint's fingerprint.")
    tokenizer_dir = models.CharField(max_length=500, help_text="The directory holding its tokenizer.json.")
    model_name = models.CharField(max_length=200, help_text="The model whose tokenizer it is, for the pages.")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.TOKENIZING)
    message = models.TextField(blank=True, help_text="Why tokenizing failed, for the UI.")
    n_tokens = models.BigIntegerField(default=0, help_text="0 until the corpus is tokenized.")
    max_id = models.BigIntegerField(default=0, help_text="The largest token id: a model needs more embeddings.")
    val_start = models.BigIntegerField(
        null=True, blank=True, help_text="Index of the token where the dataset's validation text begins.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "tokenizer_sha256"],
                                               name="unique_tokens_per_dataset_and_tokenizer")]

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
    def train_tokens(self) -> int:
        if self.val_start is not None:
            return self.val_start
        return split_sizes(self.n_tokens, self.dataset.val_fraction)[0]
