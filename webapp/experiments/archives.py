"""Model downloads: a finished trial's model directory, packed as a .tar.gz by the web worker on request.

`trial_archive_request` (a page's POST) records the archive as preparing and sends `trial_archive_build` to
the web worker; the trial's page refreshes until the archive is ready and then links the file, which the
web server streams from disk. The archive is written under a temporary name and renamed into place, so a
download never sees half of one, and building it again (a message delivered twice) changes nothing. It
carries the model's tokenizer: an export made before the engine copied the tokenizer gets the one its
tokens were made with (`export_tokenizer.fallback_files`), so that the download loads with ``AutoTokenizer``.
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
import time
import uuid
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError

from webapp.background.outbox import work_enqueue
from webapp.experiments.export_tokenizer import fallback_files, has_tokenizer, model_context
from webapp.ground.models import Trial, TrialArchive

log = logging.getLogger(__name__)


def trial_model_dir(trial: Trial) -> Path | None:
    """The trial's exported model directory, when it has one under ``HYDRA_DATA_DIR/exports``."""
    exports = (settings.HYDRA.data_dir / "exports").resolve()
    directory = Path(trial.export_path).resolve() if trial.export_path else None
    if directory is None or not directory.is_relative_to(exports) or not directory.is_dir():
        return None
    return directory


def trial_archive_get(*, trial: Trial) -> TrialArchive | None:
    """The archive of the trial's current attempt, if one was asked for."""
    return TrialArchive.objects.filter(trial=trial, queue_id=trial.queue_id).first()


def trial_archive_request(*, trial: Trial) -> TrialArchive:
    """Ask the web worker to pack the trial's model (again, if an earlier try failed or packed an earlier
    attempt, or its last send failed). The archive's ``send_error`` says why Redis could not be reached; the
    ingest's pass sends it later. Raises ValidationError when the trial has no exported model."""
    if trial_model_dir(trial) is None:
        raise ValidationError(f"Trial #{trial.number} has no exported model to download.")
    archive, _ = TrialArchive.objects.get_or_create(trial=trial, defaults={"queue_id": trial.queue_id})
    if archive.queue_id != trial.queue_id or archive.status == TrialArchive.Status.FAILED:
        archive.queue_id, archive.status, archive.message, archive.size_bytes = (
            trial.queue_id, TrialArchive.Status.PREPARING, "", None)
        archive.save()
    if archive.status == TrialArchive.Status.PREPARING:
        work_enqueue(row=archive)
    return archive


def trial_archive_build(*, archive_id: int) -> None:
    """Pack the model directory of a preparing archive; it becomes ready, or failed with a message."""
    archive = TrialArchive.objects.filter(pk=archive_id, status=TrialArchive.Status.PREPARING).select_related(
        "trial__experiment").first()
    if archive is None:
        return
    pending = TrialArchive.objects.filter(pk=archive_id, status=TrialArchive.Status.PREPARING,
                                          queue_id=archive.queue_id)
    directory = trial_model_dir(archive.trial)
    if directory is None or archive.trial.queue_id != archive.queue_id:
        pending.update(status=TrialArchive.Status.FAILED, message="The trial's model is gone (deleted or retried).")
        return
    archive.directory.mkdir(parents=True, exist_ok=True)
    partial = archive.directory / f".partial-{uuid.uuid4().hex}"
    try:
        # The fastest gzip level: weights compress little at any level, and the higher levels take several
        # times as long on a model of hundreds of megabytes.
        with tarfile.open(partial, mode="w:gz", compresslevel=1) as tar:
            tar.add(directory, arcname=f"trial-{archive.trial.pk}")
            if not has_tokenizer(directory):
                _add_files(tar, fallback_files(archive.trial, context=model_context(directory)),
                           under=f"trial-{archive.trial.pk}")
        os.replace(partial, archive.path)
    except OSError as error:
        log.exception("packing the model of trial %s failed", archive.trial.pk)
        pending.update(status=TrialArchive.Status.FAILED, message=f"Packing the model failed: {error}. Try again.")
        return
    finally:
        partial.unlink(missing_ok=True)
    pending.update(status=TrialArchive.Status.READY, size_bytes=archive.path.stat().st_size)


def _add_files(tar: tarfile.TarFile, files: dict[str, bytes], *, under: str) -> None:
    for name, content in files.items():
        info = tarfile.TarInfo(f"{under}/{name}")
        info.size, info.mtime, info.mode = len(content), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(content))


def archive_filename(trial: Trial) -> str:
    return f"{trial.experiment.name}-trial-{trial.number}.tar.gz".replace(" ", "_").replace('"', "")
