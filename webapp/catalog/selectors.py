"""Reads about the catalog. It is lab-wide: every signed-in user sees every checkpoint."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from webapp.catalog.models import Checkpoint
from webapp.catalog.paths import inside_root


def checkpoint_list() -> QuerySet[Checkpoint]:
    """Every checkpoint, by name, whatever its status."""
    return Checkpoint.objects.select_related("created_by").order_by("name")


def ready_checkpoints() -> QuerySet[Checkpoint]:
    """The checkpoints experiments may start from: checked, with their figures."""
    return Checkpoint.objects.filter(status=Checkpoint.Status.READY).order_by("name")


def checkpoint_get(*, checkpoint_id: int) -> Checkpoint:
    """The checkpoint, or Http404."""
    return get_object_or_404(Checkpoint.objects.select_related("created_by"), pk=checkpoint_id)


def checkpoint_dir(checkpoint: Checkpoint) -> Path:
    """The checkpoint's directory, resolved under the models root. Raises ValidationError when its path now
    leads out of the root (a link changed since it was checked) or the directory is gone."""
    directory = inside_root(checkpoint.path)
    if not directory.is_dir():
        raise ValidationError(f"The directory of checkpoint {checkpoint.name!r} ({checkpoint.path}) is gone.")
    return directory


def checkpoint_can_remove(*, user: AbstractBaseUser, checkpoint: Checkpoint) -> bool:
    """Who registered a checkpoint, and staff, may remove it from the catalog; nobody while it is importing
    (the web worker is writing its directory)."""
    if checkpoint.status == Checkpoint.Status.IMPORTING or not user.is_authenticated:
        return False
    return bool(user.is_staff) or (checkpoint.created_by_id is not None and checkpoint.created_by_id == user.pk)
