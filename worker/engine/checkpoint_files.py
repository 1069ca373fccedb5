"""Reading a checkpoint directory's files: only its own, and only as much as such a file can hold.

A checkpoint directory is named by its real path (the web app stores it resolved under the models root), so a
symbolic link swapped in on that path after it was checked, for the directory itself or for a file in it, is
refused at every use (:func:`checkpoint_dir`, :func:`checkpoint_file`) rather than followed out of it. A
file the engine parses whole is read only when its size is within a limit far above any real checkpoint's
(:func:`read_limited`), so that a crafted multi-gigabyte ``config.json`` costs a ``stat``, not the memory.

Torch-free and Django-free: the web app reads checkpoints through it too.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from worker.engine.errors import CheckpointError, CheckpointFileTooLarge, CheckpointLinkError

# config.json, generation_config.json, tokenizer_config.json, special_tokens_map.json, adapter_config.json and
# model.safetensors.index.json are kilobytes (the index of a 405B-parameter Llama, 1,138 tensors, is ~100 KB).
CHECKPOINT_JSON_MAX_BYTES = 1 << 20
# tokenizer.json holds the whole vocabulary and its merges: ~2 MB at 50k tokens, ~35 MB at 256k (Gemma 3's).
TOKENIZER_JSON_MAX_BYTES = 64 << 20


def checkpoint_dir(directory: Path | str) -> Path:
    """``directory`` (absolute) when it is a directory named by its real path, none of whose entries is a
    symbolic link that leads out of it. Raises :class:`CheckpointLinkError` when a link on its path leads
    elsewhere or an entry leads out, :class:`CheckpointError` when it is not a directory."""
    path = Path(directory).absolute()
    if path.resolve() != path:
        raise CheckpointLinkError(f"{path} is not the checkpoint directory's real path: a symbolic link on it "
                                  "leads elsewhere. A checkpoint is read only from the real directory it was "
                                  "checked at.", path=path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory")
    for entry in path.iterdir():
        checkpoint_file(path, entry.name)
    return path


def checkpoint_file(directory: Path, name: str) -> Path:
    """The real path of the file ``name`` of the checkpoint ``directory`` (it need not exist). Raises
    :class:`CheckpointLinkError` when a symbolic link, or a ``..`` in ``name``, leads it out of the directory."""
    real_dir = Path(directory).resolve()
    path = (real_dir / name).resolve()
    if not path.is_relative_to(real_dir) or path == real_dir:
        raise CheckpointLinkError(f"{Path(directory) / name} leads out of the checkpoint directory {directory} "
                                  "(a symbolic link or '..'); a checkpoint's files must be its own.",
                                  path=Path(directory) / name)
    return path


def read_limited(path: Path, *, limit: int) -> bytes:
    """The content of the regular file ``path`` when it is at most ``limit`` bytes. Raises
    :class:`CheckpointFileTooLarge` (checked before reading) or :class:`CheckpointError` when it is missing,
    unreadable or not a regular file."""
    try:
        # O_NONBLOCK: a FIFO put in a file's place would block open() until a writer comes; a file ignores it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    except OSError as error:
        raise CheckpointError(f"{path} cannot be read: {error}") from error
    with os.fdopen(fd, "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise CheckpointError(f"{path} is not a regular file")
        if status.st_size > limit:
            raise CheckpointFileTooLarge(path, size_bytes=status.st_size, limit_bytes=limit)
        try:
            data = file.read(limit + 1)
        except OSError as error:
            raise CheckpointError(f"{path} cannot be read: {error}") from error
        if len(data) > limit:  # it grew since fstat
            raise CheckpointFileTooLarge(path, size_bytes=os.fstat(file.fileno()).st_size, limit_bytes=limit)
    return data


def read_json(path: Path, *, limit: int = CHECKPOINT_JSON_MAX_BYTES) -> Any:
    """The JSON value of the file ``path``, read by :func:`read_limited`. Raises :class:`CheckpointError` when
    it is not JSON (nesting too deep for the parser included), :class:`CheckpointFileTooLarge` as that does."""
    data = read_limited(path, limit=limit)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} cannot be read as JSON: {error}") from error
    except RecursionError:
        raise CheckpointError(f"{path} cannot be read as JSON: it is nested too deep") from None
