"""The dataset form rejects empty, binary, undecodable and oversized uploads with a field error."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from webapp.datasets.forms import DatasetForm


def form_with(content: bytes, **data: object) -> DatasetForm:
    upload = SimpleUploadedFile("corpus.txt", content, content_type="text/plain")
    return DatasetForm({"source": "upload", "vocab_size": 300, "val_fraction": 0.1, **data}, {"file": upload})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"  \n\t\n", "empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
        (b"caf\xe9 au lait", "not UTF-8"),
    ],
)
def test_it_rejects_files_that_are_not_text(content, message):
    form = form_with(content)
    assert not form.is_valid()
    assert message in " ".join(form.errors["file"])


def test_it_rejects_a_file_over_the_limit(settings):
    import dataclasses

    settings.HYDRA = dataclasses.replace(settings.HYDRA, max_upload_bytes=1024)
    form = form_with(b"a" * 1025)
    assert not form.is_valid()
    assert "the limit of 1.0" in " ".join(form.errors["file"])


def test_it_names_the_byte_that_is_not_utf8_in_a_later_chunk():
    content = b"a" * 70_000 + b"\xff" + b"b" * 10  # past the first 64 KiB chunk
    form = form_with(content)
    assert not form.is_valid()
    assert "byte 70000 (b'\\xff')" in " ".join(form.errors["file"])


def test_it_requires_a_file_for_an_upload():
    form = DatasetForm({"source": "upload", "vocab_size": 300, "val_fraction": 0.1})
    assert not form.is_valid()
    assert "Choose a file" in " ".join(form.errors["file"])


def test_it_accepts_utf8_text_and_names_it_after_the_file():
    form = form_with("Grüße aus Köln.\n".encode())
    assert form.is_valid(), form.errors
    assert form.cleaned_data["corpus"].read() == "Grüße aus Köln.\n".encode()
    assert form.cleaned_data["name"] == "corpus.txt"


def test_it_uses_the_sample_corpus_without_an_upload():
    form = DatasetForm({"source": "sample", "vocab_size": 300, "val_fraction": 0.1})
    assert form.is_valid(), form.errors
    text = form.cleaned_data["corpus"].read().decode()
    assert "Python" in text and len(text) > 100_000


@pytest.mark.parametrize("vocab_size", [10, 100_000])
def test_it_rejects_a_vocabulary_size_out_of_range(vocab_size):
    form = DatasetForm({"source": "sample", "vocab_size": vocab_size, "val_fraction": 0.1})
    assert not form.is_valid()
    assert "vocab_size" in form.errors
