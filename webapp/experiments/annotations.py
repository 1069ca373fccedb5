"""Tags and notes on experiments and trials: what a team labels its work with, to find it again.

A tag is 1 to 32 characters of letters, digits, ``-``, ``_``, ``.`` and spaces, stored lower-case with runs of
spaces made one, so that ``Baseline`` and ``baseline `` are the same tag; an object has at most 16, each once.
Notes are free text of at most 10,000 characters. Only who may change the experiment (its team's owners and
its creator, `webapp.accounts.roles`) changes its tags and notes, or those of its trials.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from django import forms
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError

from webapp.experiments.services import experiment_require_change
from webapp.ground.models import Experiment, Trial

TAG_MAX_CHARS = 32
MAX_TAGS = 16
NOTES_MAX_CHARS = 10_000
TAG_PATTERN = re.compile(r"[^\W_]|[-_. ]")  # one allowed character: a letter or digit (any script), - _ . space


def tag_normalize(raw: str) -> str:
    """A tag as stored: lower-case, without surrounding spaces, runs of spaces made one."""
    return " ".join(raw.split()).lower()


def tags_clean(raw: Iterable[str]) -> list[str]:
    """The tags as stored (normalized, each once, in the order given, empty ones dropped), or ValidationError
    naming every tag that is too long or holds another character, or saying there are too many."""
    tags: list[str] = []
    errors: list[str] = []
    for value in raw:
        tag = tag_normalize(value)
        if not tag or tag in tags:
            continue
        if len(tag) > TAG_MAX_CHARS:
            errors.append(f"Tag {tag!r} is longer than {TAG_MAX_CHARS} characters.")
        elif not all(TAG_PATTERN.fullmatch(char) for char in tag):
            errors.append(f"Tag {tag!r}: use letters, digits, '-', '_', '.' and spaces only.")
        tags.append(tag)
    if len(tags) > MAX_TAGS:
        errors.append(f"At most {MAX_TAGS} tags ({len(tags)} given).")
    if errors:
        raise ValidationError(errors)
    return tags


def tags_parse(text: str) -> list[str]:
    """Comma-separated tags as typed in a form, cleaned (`tags_clean`)."""
    return tags_clean(text.split(","))


class AnnotationsForm(forms.Form):
    """The tags (comma-separated) and notes of an experiment or a trial."""

    tags = forms.CharField(required=False, max_length=MAX_TAGS * (TAG_MAX_CHARS + 2),
                           help_text=f"Comma-separated, at most {MAX_TAGS}: letters, digits, - _ . and spaces.")
    notes = forms.CharField(required=False, max_length=NOTES_MAX_CHARS, strip=False,
                            widget=forms.Textarea(attrs={"rows": 5}))

    def clean_tags(self) -> list[str]:
        return tags_parse(self.cleaned_data["tags"])

    def clean_notes(self) -> str:
        return self.cleaned_data["notes"].replace("\r\n", "\n").strip()

    @classmethod
    def of(cls, obj: Experiment | Trial) -> AnnotationsForm:
        return cls(initial={"tags": ", ".join(obj.tags), "notes": obj.notes})


def annotations_set(*, obj: Experiment | Trial, actor: AbstractBaseUser, tags: Iterable[str], notes: str) -> None:
    """Replace the tags and notes of an experiment or a trial. PermissionDenied unless `actor` may change the
    experiment; ValidationError for a bad tag or notes too long."""
    experiment = obj if isinstance(obj, Experiment) else obj.experiment
    experiment_require_change(actor=actor, experiment=experiment)
    cleaned = tags_clean(tags)
    if len(notes) > NOTES_MAX_CHARS:
        raise ValidationError({"notes": f"Notes are at most {NOTES_MAX_CHARS:,} characters ({len(notes):,} given)."})
    obj.tags, obj.notes = cleaned, notes
    obj.save(update_fields=["tags", "notes"])
