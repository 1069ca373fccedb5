"""Model downloads: a finished trial's exported model, packed as a .tar.gz by the web worker on request.

A trial offers one download of each kind its export has (`trial_downloads`): its model (`Kind.MODEL`: the export
directory, which for a LoRA trial is the merged model, loading alone with ``AutoModelForCausalLM``), and for a
LoRA trial its adapter alone (`Kind.ADAPTER`: the PEFT adapter directory, a few megabytes, with the tokenizer).
The adapter's ``adapter_config.json`` names its base by the name the world knows it by (the catalog's
`checkpoint_hub_name`, e.g. ``HuggingFaceTB/SmolLM2-135M-Instruct``), not by its path on this server, so that
``PeftModel.from_pretrained`` finds the base on the user's machine.

`trial_archive_request` (a page's POST, or the API's) records the archive as preparing with the bytes it will
pack and sends `trial_archive_build` to the web worker, which writes how many it has packed as it goes
(`packed_bytes`, every `PROGRESS_EVERY_S` at most) for the page and the API to show; the page links the file
once it is ready, and the web server streams it from disk. The archive is written under a temporary name and
renamed into place, so a download never sees half of one, and building it again (a message delivered twice)
changes nothing. It unpacks into one folder named as the file is (`download_name`: the experiment, the trial's
number in it and its id, the kind). It carries the model's tokenizer: an export made before the engine copied
the tokenizer gets the one its tokens were made with (`export_tokenizer.fallback_files`), so that the
download loads with ``AutoTokenizer``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import tarfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from webapp.background.outbox import work_enqueue
from webapp.catalog.models import Checkpoint
from webapp.catalog.selectors import checkpoint_hub_name
from webapp.experiments.export_tokenizer import fallback_files, has_tokenizer, model_context
from webapp.ground.models import Trial, TrialArchive
from webapp.worker_door import CHECKPOINT_JSON_MAX_BYTES, TOKENIZER_FILES, CheckpointError, read_limited

log = logging.getLogger(__name__)
Kind = TrialArchive.Kind
ADAPTER_DIR = "adapter"  # the PEFT adapter's folder inside a LoRA trial's export (`worker.engine.lora.ADAPTER_DIR`)
ADAPTER_CONFIG = "adapter_config.json"
PROGRESS_EVERY_S = 0.5
CHUNK_BYTES = 1 << 20
LABELS = {Kind.ADAPTER: "adapter", Kind.MODEL: "model"}
# gzip's fastest level for a model: weights dequantized from a GGUF file shrink by almost half even so, and the
# higher levels take several times as long on hundreds of megabytes for a few percent more. An adapter is a few
# megabytes: compressing it harder costs nothing to notice.
GZIP_LEVEL = {Kind.ADAPTER: 6, Kind.MODEL: 1}


@dataclass(frozen=True)
class Download:
    """One download a trial offers: its kind, what it is, the bytes it packs, and its archive if one was asked
    for (of the trial's current attempt)."""

    kind: str
    title: str
    about: str
    content_bytes: int
    archive: TrialArchive | None


def trial_model_dir(trial: Trial) -> Path | None:
    """The trial's exported model directory, when it has one under ``HYDRA_DATA_DIR/exports``."""
    exports = (settings.HYDRA.data_dir / "exports").resolve()
    directory = Path(trial.export_path).resolve() if trial.export_path else None
    if directory is None or not directory.is_relative_to(exports) or not directory.is_dir():
        return None
    return directory


def download_kinds(directory: Path) -> list[str]:
    """The downloads an export directory makes: the adapter alone first when it has one, then the model."""
    adapter = directory / ADAPTER_DIR / ADAPTER_CONFIG
    return [Kind.ADAPTER, Kind.MODEL] if adapter.is_file() else [Kind.MODEL]


def trial_downloads(*, trial: Trial) -> list[Download]:
    """What the trial's page offers to download, with each archive's state; [] without an exported model."""
    directory = trial_model_dir(trial)
    if directory is None:
        return []
    kinds = download_kinds(directory)
    archives = {a.kind: a for a in _current(trial)}
    lora = Kind.ADAPTER in kinds
    about = {Kind.MODEL: "The trained model with its tokenizer: it loads with AutoModelForCausalLM.from_pretrained."}
    if lora:
        about = {Kind.ADAPTER: "The LoRA adapter alone (PEFT), with the tokenizer: load it on the base model with "
                               f"PeftModel.from_pretrained; it names its base as {_base_name(trial)}.",
                 Kind.MODEL: "The base model with the adapter merged in, with the tokenizer: it loads alone with "
                             "AutoModelForCausalLM.from_pretrained."}
    titles = {Kind.ADAPTER: "Adapter", Kind.MODEL: "Merged model" if lora else "Model"}
    return [Download(kind, titles[kind], about[kind], sum(_size(source) for _, source in _members(
        trial, directory, kind)), archives.get(kind)) for kind in kinds]


def _current(trial: Trial) -> QuerySet[TrialArchive]:
    return TrialArchive.objects.filter(trial=trial, queue_id=trial.queue_id)


def trial_archive_get(*, trial: Trial, kind: str = Kind.MODEL) -> TrialArchive | None:
    """The archive of that kind of the trial's current attempt, if one was asked for."""
    return _current(trial).filter(kind=kind).first()


def trial_archive_request(*, trial: Trial, kind: str = Kind.MODEL) -> TrialArchive:
    """Ask the web worker to pack the trial's model or adapter (again, if an earlier try failed or packed an
    earlier attempt, or its last send failed). The archive's ``send_error`` says why Redis could not be reached;
    the ingest's pass sends it later. Raises ValidationError when the trial has no exported model, or no
    download of that kind (an adapter of a trial that trained no LoRA)."""
    directory = trial_model_dir(trial)
    if directory is None:
        raise ValidationError(f"Trial #{trial.number} has no exported model to download.")
    if kind not in download_kinds(directory):
        offered = " and ".join(download_kinds(directory))
        raise ValidationError(f"Trial #{trial.number} has no {kind} to download (it offers: {offered}).")
    archive, _ = TrialArchive.objects.get_or_create(trial=trial, kind=kind, defaults={"queue_id": trial.queue_id})
    if archive.queue_id != trial.queue_id or archive.status == TrialArchive.Status.FAILED:
        archive.queue_id, archive.status, archive.message, archive.size_bytes = (
            trial.queue_id, TrialArchive.Status.PREPARING, "", None)
        archive.packed_bytes, archive.total_bytes = 0, None
        archive.save()
    if archive.status == TrialArchive.Status.PREPARING:
        if archive.total_bytes is None:
            archive.total_bytes = sum(_size(source) for _, source in _members(trial, directory, kind))
            archive.save(update_fields=["total_bytes"])
        work_enqueue(row=archive)
    return archive


def trial_archive_build(*, archive_id: int) -> None:
    """Pack the files of a preparing archive, counting the bytes as it goes; it becomes ready, or failed with a
    message."""
    archive = TrialArchive.objects.filter(pk=archive_id, status=TrialArchive.Status.PREPARING).select_related(
        "trial__experiment").first()
    if archive is None:
        return
    pending = TrialArchive.objects.filter(pk=archive_id, status=TrialArchive.Status.PREPARING,
                                          queue_id=archive.queue_id)
    trial = archive.trial
    directory = trial_model_dir(trial)
    if directory is None or trial.queue_id != archive.queue_id or archive.kind not in download_kinds(directory):
        pending.update(status=TrialArchive.Status.FAILED, message="The trial's model is gone (deleted or retried).")
        return
    members = _members(trial, directory, archive.kind)
    progress = _Progress(pending, total=sum(_size(source) for _, source in members))
    archive.directory.mkdir(parents=True, exist_ok=True)
    partial = archive.directory / f".partial-{uuid.uuid4().hex}"
    folder = download_name(trial, archive.kind)
    try:
        with tarfile.open(partial, mode="w:gz", compresslevel=GZIP_LEVEL[Kind(archive.kind)]) as tar:
            for name, source in members:
                _add(tar, f"{folder}/{name}", source, progress)
        os.replace(partial, archive.path)
    except OSError as error:
        log.exception("packing the %s of trial %s failed", archive.kind, trial.pk)
        pending.update(status=TrialArchive.Status.FAILED, message=f"Packing the {archive.kind} failed: {error}. "
                                                                   "Try again.")
        return
    finally:
        partial.unlink(missing_ok=True)
    pending.update(status=TrialArchive.Status.READY, size_bytes=archive.path.stat().st_size,
                   packed_bytes=progress.total)


def _members(trial: Trial, directory: Path, kind: str) -> list[tuple[str, Path | bytes]]:
    """The archive's files: each one's name inside its folder, and its file or its content."""
    if kind == Kind.ADAPTER:
        adapter = directory / ADAPTER_DIR
        members: list[tuple[str, Path | bytes]] = [
            (path.name, path) for path in sorted(adapter.iterdir())
            if path.name != ADAPTER_CONFIG and path.is_file() and not path.is_symlink()]
        members.append((ADAPTER_CONFIG, _adapter_config(trial, adapter / ADAPTER_CONFIG)))
        members += [(name, directory / name) for name in TOKENIZER_FILES
                    if (directory / name).is_file() and not (directory / name).is_symlink()]
    else:
        members = [(path.relative_to(directory).as_posix(), path) for path in sorted(directory.rglob("*"))
                   if path.is_file() and not path.is_symlink()
                   and path.relative_to(directory).parts[0] != ADAPTER_DIR]
    if not has_tokenizer(directory):
        members += list(fallback_files(trial, context=model_context(directory)).items())
    return members


def _adapter_config(trial: Trial, path: Path) -> bytes:
    """The adapter's config with its base named as the world knows it (`_base_name`), not by a server path."""
    try:
        config = json.loads(read_limited(path, limit=CHECKPOINT_JSON_MAX_BYTES))
    except (CheckpointError, ValueError) as error:
        raise OSError(f"{path.name} is unreadable: {error}") from None
    if not isinstance(config, dict):
        raise OSError(f"{path.name} holds no JSON object")
    config["base_model_name_or_path"] = _base_name(trial, config.get("base_model_name_or_path"))
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()


def _base_name(trial: Trial, written: Any = None) -> str:
    """The public name of the trial's base model: its catalog checkpoint's (`checkpoint_hub_name`), the name
    the experiment recorded when the checkpoint has left the catalog, else the last part of `written`."""
    model = trial.experiment.model or {}
    checkpoint = Checkpoint.objects.filter(pk=model.get("checkpoint")).first() if model.get("checkpoint") else None
    if checkpoint is not None:
        return checkpoint_hub_name(checkpoint)
    if model.get("checkpoint_name"):
        return str(model["checkpoint_name"])
    return Path(str(written or "base-model")).name


def _size(source: Path | bytes) -> int:
    return len(source) if isinstance(source, bytes) else source.stat().st_size


class _Progress:
    """Counts the bytes packed and writes the count to the archive's row, `PROGRESS_EVERY_S` apart at most."""

    def __init__(self, pending: QuerySet[TrialArchive], *, total: int) -> None:
        self.pending, self.total, self.done, self.written_at = pending, total, 0, time.monotonic()
        pending.update(total_bytes=total, packed_bytes=0)

    def add(self, n: int) -> None:
        self.done += n
        if time.monotonic() - self.written_at >= PROGRESS_EVERY_S:
            self.pending.update(packed_bytes=self.done)
            self.written_at = time.monotonic()


class _Counted(io.RawIOBase):
    """A file whose reads `_Progress` counts (tarfile copies a member through ``read``)."""

    def __init__(self, handle: IO[bytes], progress: _Progress) -> None:
        self.handle, self.progress = handle, progress

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size if size is not None and size >= 0 else CHUNK_BYTES)
        self.progress.add(len(data))
        return data


def _add(tar: tarfile.TarFile, name: str, source: Path | bytes, progress: _Progress) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = _size(source), 0o644
    if isinstance(source, bytes):
        info.mtime = int(time.time())
        tar.addfile(info, _Counted(io.BytesIO(source), progress))
        return
    info.mtime = int(source.stat().st_mtime)
    with source.open("rb") as handle:
        tar.addfile(info, _Counted(handle, progress))


def download_name(trial: Trial, kind: str) -> str:
    """The name of a download, and of the folder it unpacks into: the experiment, the trial's number in it, its
    id (what the API and ``hydra`` take) and the kind, e.g. ``lora_sweep-trial-2-id-41-adapter``."""
    experiment = re.sub(r"[^A-Za-z0-9._-]+", "_", trial.experiment.name).strip("._") or "experiment"
    return f"{experiment}-trial-{trial.number}-id-{trial.pk}-{LABELS[Kind(kind)]}"


def archive_filename(trial: Trial, kind: str) -> str:
    return f"{download_name(trial, kind)}.tar.gz"
