"""Files a user names in the import folder (``HYDRA_IMPORT_DIR``): datasets too large to upload, put there by
someone with access to the server.

The web worker reads the copy `dataset_create` makes, but the request copies whatever the path names, so an
absolute path, a ``..`` and a symbolic link that resolves outside the folder are all refused, each with a
message that says so (the catalog confines its model paths to the models root the same way).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from django.conf import settings
from django.core.exceptions import ValidationError

MAX_PATH_CHARS = 255  # the dataset's ``filename``, where the path is kept


def import_dir() -> Path:
    return Path(settings.HYDRA.import_dir).resolve()


def import_file(relative: str, *, suffixes: tuple[str, ...]) -> Path:
    """The resolved file `relative` names in the import folder, its suffix one of `suffixes`; ValidationError
    if the path leaves the folder, names no file, or has another suffix."""
    text = relative.strip()
    if not text:
        raise ValidationError("Give the file's path relative to the import folder.")
    if len(text) > MAX_PATH_CHARS:
        raise ValidationError(f"The path is over {MAX_PATH_CHARS} characters.")
    if "\x00" in text:
        raise ValidationError("The path contains a NUL character.")
    root = import_dir()
    if PurePosixPath(text).is_absolute() or Path(text).is_absolute():
        raise ValidationError(f"{text!r} is an absolute path; give a path relative to the import folder {root}.")
    if ".." in PurePosixPath(text).parts:
        raise ValidationError(f"{text!r} contains '..'; give a path inside the import folder {root}.")
    path = (root / text).resolve()
    if not path.is_relative_to(root) or path == root:
        raise ValidationError(f"{text!r} leads outside the import folder {root} (a symbolic link); give a path "
                              "inside it.")
    if path.suffix.lower() not in suffixes:
        raise ValidationError(f"{text!r} is not a {', '.join(suffixes)} file.")
    if not path.is_file():
        raise ValidationError(f"There is no file {text!r} in the import folder {root}.")
    return path
