"""The catalog's forms: register a model directory, import a GGUF file. Paths are checked by the services."""

from __future__ import annotations

from django import forms

from webapp.catalog.paths import MAX_PATH_CHARS
from webapp.catalog.services import MAX_NAME_CHARS


class RegisterForm(forms.Form):
    name = forms.CharField(max_length=MAX_NAME_CHARS, help_text="How the catalog and the experiment form show it.")
    path = forms.CharField(
        max_length=MAX_PATH_CHARS, label="Directory",
        help_text="A transformers save_pretrained directory (config.json, safetensors weights, tokenizer.json), "
                  "relative to the models root.")


class GgufForm(forms.Form):
    gguf_file = forms.CharField(
        max_length=MAX_PATH_CHARS, label="GGUF file",
        help_text="A .gguf file relative to the models root; it is imported into a directory beside it.")
    name = forms.CharField(max_length=MAX_NAME_CHARS, required=False,
                           help_text="Optional: the file's name without .gguf by default.")
