"""The dataset form: turns an upload (or the sample choice) into validated text and tokenizer settings."""

from __future__ import annotations

import codecs

from django import forms
from django.conf import settings
from django.core.files.base import ContentFile, File
from django.core.files.uploadedfile import UploadedFile
from django.template.defaultfilters import filesizeformat

from webapp.datasets.models import Dataset
from webapp.datasets.sample_corpus import sample_corpus_text
from webapp.datasets.tokenization import MAX_VOCAB_SIZE, MIN_VOCAB_SIZE


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
    file = forms.FileField(required=False, help_text="A UTF-8 text file.")
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

    def clean(self) -> dict[str, object]:
        """Adds ``corpus`` (a file) and fills ``name``: the form's output is what `dataset_create` takes."""
        cleaned = super().clean()
        source = cleaned.get("source")
        upload: UploadedFile | None = cleaned.get("file")
        if source == Dataset.Source.UPLOAD:
            if upload is None:
                if "file" not in self.errors:
                    self.add_error("file", "Choose a file to upload, or use the built-in sample corpus.")
                return cleaned
            try:
                check_corpus(upload)
            except forms.ValidationError as error:
                self.add_error("file", error)
                return cleaned
            cleaned["corpus"] = upload
            cleaned["filename"] = upload.name or ""
            cleaned["name"] = cleaned.get("name") or upload.name or "Uploaded corpus"
        elif source == Dataset.Source.SAMPLE:
            cleaned["corpus"] = ContentFile(sample_corpus_text().encode("utf-8"), name="sample.txt")
            cleaned["filename"] = ""
            cleaned["name"] = cleaned.get("name") or "Python reference (sample)"
        return cleaned
