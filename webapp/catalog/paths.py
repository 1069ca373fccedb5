"""Paths a user names in the catalog are relative to the models root (``HYDRA_MODELS_ROOT``) and stay in it.

The web worker reads whatever these return, so an absolute path, a ``..`` and a symbolic link that resolves
outside the root are all refused, each with a message that says so; what is stored is the resolved path
relative to the root, so a link swapped later cannot move a registered checkpoint out of it either
(`inside_root` checks again on every use; `registered_dir` also checks the directory's files, as the engine
does before it reads them).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from django.conf import settings
from django.core.exceptions import ValidationError

from webapp.worker_door import CheckpointError, checkpoint_dir

MAX_PATH_CHARS = 500


def models_root() -> Path:
    return Path(settings.HYDRA.models_root).resolve()


def inside_root(relative: str) -> Path:
    """The resolved path `relative` names under the models root; ValidationError if it leaves the root."""
    text = relative.strip()
    if not text:
        raise ValidationError("Give a path relative to the models root.")
    if len(text) > MAX_PATH_CHARS:
        raise ValidationError(f"The path is over {MAX_PATH_CHARS} characters.")
    if "\x00" in text:
        raise ValidationError("The path contains a NUL character.")
    root = models_root()
    if PurePosixPath(text).is_absolute() or Path(text).is_absolute():
        raise ValidationError(f"{text!r} is an absolute path; give a path relative to the models root {root}.")
    if ".." in PurePosixPath(text).parts:
        raise ValidationError(f"{text!r} contains '..'; give a path inside the models root {root}.")
    candidate = (root / text).resolve()
    if not candidate.is_relative_to(root) or candidate == root:
        raise ValidationError(f"{text!r} leads outside the models root {root} (a symbolic link); give a path "
                              "inside it.")
    return candidate


def relative_to_root(path: Path) -> str:
    """`path` (resolved, under the root) as the catalog stores it: relative, with forward slashes."""
    return path.relative_to(models_root()).as_posix()


def existing_dir(relative: str) -> Path:
    """The directory `relative` names under the models root; ValidationError if it leaves it or is none."""
    path = inside_root(relative)
    if not path.is_dir():
        raise ValidationError(f"There is no directory {relative.strip()!r} under the models root {models_root()}.")
    return path


def registered_dir(relative: str) -> Path:
    """The directory of a registered checkpoint, resolved again at this use: ValidationError when a symbolic
    link swapped in since it was checked leads it out of the models root, or one of its files out of it. A
    directory that is gone is returned as it is: what that means is the caller's to say."""
    path = inside_root(relative)
    if path.is_dir():
        try:
            checkpoint_dir(path)
        except CheckpointError as error:
            raise ValidationError(str(error)) from None
    return path


def existing_gguf_file(relative: str) -> Path:
    """The ``.gguf`` file `relative` names under the models root; ValidationError otherwise."""
    path = inside_root(relative)
    if path.suffix.lower() != ".gguf":
        raise ValidationError(f"{relative.strip()!r} is not a .gguf file; give the path of one.")
    if not path.is_file():
        raise ValidationError(f"There is no file {relative.strip()!r} under the models root {models_root()}.")
    return path
