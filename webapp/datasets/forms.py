"""The dataset form: turns an upload (or the sample choice) into validated text and tokenizer settings."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.template.defaultfilters import filesizeformat

from webapp.datasets.models import Dataset
from webapp.datasets.sample_corpus import sample_corpus_text
from webapp.datasets.tokenization import MAX_VOCAB_SIZE, MIN_VOCAB_SIZE


def decode_corpus(raw: bytes) -> str:
    """The UTF-8 text of an uploaded corpus, or ValidationError saying why it is not one (empty/binary/bad)."""
    if not raw.strip():
        raise forms.ValidationError("The file is empty; upload a UTF-8 text corpus.", code="empty")
    if b"\x00" in raw:
        raise forms.ValidationError(
            "The file looks binary (it contains NUL bytes); upload plain UTF-8 text.", code="binary"
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise forms.ValidationError(
            f"The file is not UTF-8 text: byte {error.start} ({raw[error.start:error.start + 1]!r}) cannot be "
            "decoded. Save it as UTF-8 and upload again.",
            code="undecodable",
        ) from None


class DatasetForm(forms.Form):
    name = forms.CharField(max_length=120, required=False, help_text="Defaults to the file's name.")
    source = forms.ChoiceField(choices=Dataset.Source.choices, initial=Dataset.Source.SAMPLE,
                               widget=forms.RadioSelect)
    file = forms.FileField(required=False, help_text="A UTF-8 text file.")
    vocab_size = forms.IntegerField(min_value=MIN_VOCAB_SIZE, max_value=MAX_VOCAB_SIZE, initial=2048,
                                    help_text="Tokenizer vocabulary size (byte-level BPE).")
    val_fraction = forms.FloatField(min_value=0.01, max_value=0.5, initial=0.1,
                                    help_text="Fraction of the tokens held out for validation.")

    def clean_file(self) -> UploadedFile | None:
        upload: UploadedFile | None = self.cleaned_data.get("file")
        limit = settings.HYDRA.max_upload_bytes
        if upload is not None and upload.size is not None and upload.size > limit:
            raise forms.ValidationError(
                f"The file is {filesizeformat(upload.size)}; the limit is {filesizeformat(limit)} "
                "(HYDRA_MAX_UPLOAD_MB).", code="too_large"
            )
        return upload

    def clean(self) -> dict[str, object]:
        """Adds ``text`` (the corpus) and fills ``name``: the form's output is what `dataset_create` takes."""
        cleaned = super().clean()
        source = cleaned.get("source")
        upload: UploadedFile | None = cleaned.get("file")
        if source == Dataset.Source.UPLOAD:
            if upload is None:
                if "file" not in self.errors:
                    self.add_error("file", "Choose a file to upload, or use the built-in sample corpus.")
                return cleaned
            try:
                cleaned["text"] = decode_corpus(upload.read())
            except forms.ValidationError as error:
                self.add_error("file", error)
                return cleaned
            cleaned["filename"] = upload.name or ""
            cleaned["name"] = cleaned.get("name") or upload.name or "Uploaded corpus"
        elif source == Dataset.Source.SAMPLE:
            cleaned["text"] = sample_corpus_text()
            cleaned["filename"] = ""
            cleaned["name"] = cleaned.get("name") or "Python reference (sample)"
        return cleaned
