"""The dataset form: turns an upload, a file in the import folder or a sample into a checked file, its kind and
tokenizer settings.

A file of instruction or chat data (a ``records.SUFFIXES`` suffix) is checked cheaply here: its kind and the
column of each role (its layout), from the columns of its first rows and those the user names (`file_head`);
the web worker reads every row. Any other file is a text corpus, checked as UTF-8 text. The data used is the
one the Data choice names: a file chosen or a path given under another choice is an error, never ignored.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile, File
from django.core.files.uploadedfile import UploadedFile
from django.template.defaultfilters import filesizeformat

from webapp.datasets.file_head import file_layout
from webapp.datasets.imports import MAX_PATH_CHARS, import_file
from webapp.datasets.layouts import ROLE_NAMES, LayoutError, columns_parse
from webapp.datasets.models import Dataset
from webapp.datasets.records import SUFFIXES, Kind, RecordsError
from webapp.datasets.sample_chat import SAMPLE_CHAT_FILENAME, SAMPLE_CHAT_NAME, sample_chat_jsonl
from webapp.datasets.sample_corpus import sample_corpus_text
from webapp.datasets.sample_preference import SAMPLE_PAIRS_FILENAME, SAMPLE_PAIRS_NAME, sample_preference_jsonl
from webapp.worker_door import MAX_VOCAB_SIZE, MIN_VOCAB_SIZE

IMPORT_SUFFIXES = (*SUFFIXES, ".txt")
KIND_CHOICES = [("", "Detect from the columns"),
                *((value, label) for value, label in Dataset.Kind.choices if value != Dataset.Kind.CORPUS)]


def check_corpus(corpus: File) -> None:
    """Raise ValidationError saying why `corpus` is not a UTF-8 text corpus (empty, binary, undecodable).

    Reads it chunk by chunk, so an upload is checked without holding it in memory; leaves it rewound.
    """
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    offset, blank = 0, True
    for chunk in corpus.chunks():
        if b"\x00" in chunk:
            raise forms.ValidationError(
                "The file looks binary (it contains NUL bytes); upload plain UTF-8 text.", code="binary"
            )
        try:
            blank = not decoder.decode(chunk).strip() and blank
        except UnicodeDecodeError as error:
            raise forms.ValidationError(
                f"The file is not UTF-8 text: byte {offset + error.start} ({chunk[error.start:error.start + 1]!r}) "
                "cannot be decoded. Save it as UTF-8 and upload again.",
                code="undecodable",
            ) from None
        offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise forms.ValidationError("The file is not UTF-8 text: it ends inside a character. Save it as UTF-8 "
                                    "and upload again.", code="undecodable") from None
    if blank:
        raise forms.ValidationError("The file is empty; upload a UTF-8 text corpus.", code="empty")
    corpus.seek(0)


def upload_limit_error(limit: int) -> str:
    return (f"The file is larger than the limit of {filesizeformat(limit)} (HYDRA_MAX_UPLOAD_MB); the upload was "
            "stopped there and nothing was stored.")


class DatasetForm(forms.Form):
    name = forms.CharField(max_length=120, required=False, help_text="Defaults to the file's name.")
    source = forms.ChoiceField(choices=Dataset.Source.choices, initial=Dataset.Source.SAMPLE,
                               widget=forms.RadioSelect)
    file = forms.FileField(required=False, help_text=(
        "A UTF-8 text corpus, or instruction, chat or preference data: .jsonl, .ndjson, .json, .csv or .parquet."))
    server_path = forms.CharField(
        required=False, max_length=MAX_PATH_CHARS,
        help_text="For a file too large to upload: its path relative to the server's import folder.")
    kind = forms.ChoiceField(choices=KIND_CHOICES, required=False, help_text=(
        "Instruction and chat data: what its rows hold. text: a text column; prompt_completion: a prompt and "
        "its completion; alpaca: an instruction, an optional input and an output; messages: a conversation; "
        "preference: a prompt with a chosen and a rejected answer."))
    columns = forms.CharField(
        required=False, max_length=2_000, label="Columns", help_text=(
            "Instruction and chat data: the column of each role, when it is not found by its common names: "
            "role=column pairs, e.g. prompt=question, completion=answer. Roles: " + ", ".join(ROLE_NAMES) + "."))
    vocab_size = forms.IntegerField(min_value=MIN_VOCAB_SIZE, max_value=MAX_VOCAB_SIZE, initial=2048,
                                    help_text="Tokenizer vocabulary size (byte-level BPE).")
    val_fraction = forms.FloatField(min_value=0.01, max_value=0.5, initial=0.1,
                                    help_text="Fraction of the tokens held out for validation.")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.fields["file"].widget.attrs["data-max-bytes"] = settings.HYDRA.max_upload_bytes

    def clean_file(self) -> UploadedFile | None:
        upload: UploadedFile | None = self.cleaned_data.get("file")
        limit = settings.HYDRA.max_upload_bytes
        if upload is not None and upload.size is not None and upload.size > limit:
            raise forms.ValidationError(upload_limit_error(limit), code="too_large")
        return upload

    def clean_columns(self) -> dict[str, str]:
        try:
            return columns_parse(self.cleaned_data.get("columns") or "")
        except LayoutError as error:
            raise forms.ValidationError(f"Columns: {error}.", code="columns") from None

    def clean(self) -> dict[str, object]:
        """Adds ``corpus`` (a file) and ``filename``, resolves ``kind`` (a `Dataset.Kind`) and ``columns`` (the
        column of each role) and fills ``name``: the form's output is what `dataset_create` takes."""
        cleaned = super().clean()
        source = cleaned.get("source")
        upload: UploadedFile | None = cleaned.get("file")
        if unused := self._unused_data(source, upload, cleaned.get("server_path") or ""):
            self.add_error("source", unused)
            return cleaned
        if source == Dataset.Source.UPLOAD:
            if upload is None:
                if "file" not in self.errors:
                    self.add_error("file", "Choose a file to upload, or use a built-in sample.")
                return cleaned
            self._take("file", upload, filename=upload.name or "", check=upload)
        elif source == Dataset.Source.IMPORT:
            try:
                imported = import_file(cleaned.get("server_path") or "", suffixes=IMPORT_SUFFIXES)
            except ValidationError as error:
                self.add_error("server_path", error)
                return cleaned
            # Checked, then copied by `dataset_create` (which closes it), from this one open file.
            self._take("server_path", File(imported.file, name=imported.relative), filename=imported.relative,
                       check=File(imported.file))
        elif source == Dataset.Source.SAMPLE:
            cleaned.update(corpus=ContentFile(sample_corpus_text().encode("utf-8"), name="sample.txt"), filename="",
                           kind=Dataset.Kind.CORPUS, columns={},
                           name=cleaned.get("name") or "Python reference (sample)")
        elif source == Dataset.Source.SAMPLE_CHAT:
            cleaned.update(corpus=ContentFile(sample_chat_jsonl().encode("utf-8"), name=SAMPLE_CHAT_FILENAME),
                           filename=SAMPLE_CHAT_FILENAME, kind=Dataset.Kind.MESSAGES, columns={"messages": "messages"},
                           name=cleaned.get("name") or SAMPLE_CHAT_NAME)
        elif source == Dataset.Source.SAMPLE_PAIRS:
            cleaned.update(corpus=ContentFile(sample_preference_jsonl().encode("utf-8"), name=SAMPLE_PAIRS_FILENAME),
                           filename=SAMPLE_PAIRS_FILENAME, kind=Dataset.Kind.PREFERENCE,
                           columns={"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"},
                           name=cleaned.get("name") or SAMPLE_PAIRS_NAME)
        return cleaned

    @staticmethod
    def _unused_data(source: object, upload: UploadedFile | None, server_path: str) -> str:
        """Why the data given does not fit the Data choice ("" when it does): a file chosen, or a path given,
        under a choice that would not use it, is an error rather than ignored."""
        if source not in Dataset.Source.values:  # the choice itself is refused
            return ""
        label = Dataset.Source(source).label
        if upload is not None and source != Dataset.Source.UPLOAD:
            return (f"You chose the file {Path(upload.name or '').name!r}, but the Data choice is '{label}'. Choose "
                    f"'{Dataset.Source.UPLOAD.label}' to use the file, or remove it to use the {label.lower()}.")
        if server_path.strip() and source != Dataset.Source.IMPORT:
            return (f"You gave a path in the import folder, but the Data choice is '{label}'. Choose "
                    f"'{Dataset.Source.IMPORT.label}' to use it, or clear the path.")
        return ""

    def _take(self, field: str, corpus: File, *, filename: str, check: File) -> None:
        """Check the file (`check`, open) and set the cleaned ``corpus``, ``filename``, ``kind``, ``columns`` and
        ``name``, or add an error to `field` (to ``columns`` for the columns named)."""
        suffix, shown = Path(filename).suffix.lower(), Path(filename).name
        chosen, given = self.cleaned_data.get("kind"), self.cleaned_data.get("columns") or {}
        columns: dict[str, str] = {}
        try:
            if suffix in SUFFIXES:
                try:
                    layout = file_layout(check, suffix=suffix, kind=Kind(chosen) if chosen else None, given=given,
                                         max_decoded_bytes=settings.HYDRA.max_decoded_bytes)
                except LayoutError as error:
                    self.add_error("columns", forms.ValidationError(f"{shown}: {error}", code="columns"))
                    return
                except RecordsError as error:
                    raise forms.ValidationError(f"{shown}: {error}", code="records") from None
                kind, columns = layout.kind.value, dict(layout.columns)
            elif chosen or given:
                what = "a kind applies" if chosen else "columns apply"
                raise forms.ValidationError(
                    f"{shown} is a text corpus: {what} to instruction and chat data ({', '.join(SUFFIXES)}). "
                    "Choose 'Detect from the columns' and leave Columns blank, or upload such a file.", code="kind")
            else:
                check_corpus(check)
                kind = Dataset.Kind.CORPUS
        except forms.ValidationError as error:
            self.add_error(field, error)
            return
        self.cleaned_data.update(corpus=corpus, filename=filename, kind=kind, columns=columns,
                                 name=self.cleaned_data.get("name") or shown or "Uploaded corpus")
