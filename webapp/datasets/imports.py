"""Files a user names in the import folder (``HYDRA_IMPORT_DIR``): datasets too large to upload, put there by
someone with access to the server.

The request copies whatever the path names, so the path is opened once, a folder at a time from the import
folder's own descriptor, without following a symbolic link anywhere (``O_NOFOLLOW``), and that one open file
is what is checked and copied: nothing can swap a link in between a check and a later open by name. An
absolute path, a ``..``, a link, and anything but a regular file are refused, each with a message that names
"the import folder", never where it is on the server.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO, NamedTuple

from django.conf import settings
from django.core.exceptions import ValidationError

MAX_PATH_CHARS = 255  # the dataset's ``filename``, where the path is kept


class ImportedFile(NamedTuple):
    """The file a path names, open for reading at its start, and the path as kept (relative, normalized)."""

    file: BinaryIO
    relative: str


def import_dir() -> Path:
    return Path(settings.HYDRA.import_dir).resolve()


def import_file(relative: str, *, suffixes: tuple[str, ...]) -> ImportedFile:
    """The file `relative` names in the import folder, open, its suffix one of `suffixes`; ValidationError if
    the path is absolute, climbs with ``..``, is or passes through a symbolic link, names no regular file, or
    has another suffix. The caller closes the file (a `django.core.files.File` around it does when used in a
    ``with``)."""
    text = relative.strip()
    if not text:
        raise ValidationError("Give the file's path relative to the import folder.")
    if len(text) > MAX_PATH_CHARS:
        raise ValidationError(f"The path is over {MAX_PATH_CHARS} characters.")
    if "\x00" in text:
        raise ValidationError("The path contains a NUL character.")
    path = PurePosixPath(text)
    if path.is_absolute() or Path(text).is_absolute():
        raise ValidationError(f"{text!r} is an absolute path; give a path relative to the import folder.")
    if ".." in path.parts:
        raise ValidationError(f"{text!r} contains '..'; give a path inside the import folder.")
    if path.suffix.lower() not in suffixes:
        raise ValidationError(f"{text!r} is not a {', '.join(suffixes)} file.")
    parts = [part for part in path.parts if part != "."]
    fd = _open_folder(text)
    try:
        for part in parts[:-1]:
            fd = _step(fd, part, text, flags=os.O_DIRECTORY)
        fd = _step(fd, parts[-1], text, flags=os.O_NONBLOCK)  # a FIFO must not hang the request
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValidationError(f"{text!r} is not a file in the import folder.")
        os.set_blocking(fd, True)
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return ImportedFile(file=file, relative="/".join(parts))


def _open_folder(text: str) -> int:
    try:
        return os.open(import_dir(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise ValidationError(f"There is no file {text!r} in the import folder.") from None


def _step(fd: int, name: str, text: str, *, flags: int) -> int:
    """Open `name` in the folder `fd` without following a link, close `fd` and return the new descriptor;
    ValidationError (and `fd` left open, for the caller to close) when it cannot be."""
    try:
        opened = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | flags, dir_fd=fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and _is_link(fd, name):
            raise ValidationError(f"{text!r} is or passes through a symbolic link, which could lead outside the "
                                  "import folder; put the file itself in the import folder.") from None
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ValidationError(f"There is no file {text!r} in the import folder.") from None
        raise ValidationError(f"{text!r} cannot be opened in the import folder ({os.strerror(error.errno)}).") from None
    os.close(fd)
    return opened


def _is_link(fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
