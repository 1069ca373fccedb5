"""Reads about datasets. Every dataset a view shows comes through here, scoped to a team."""

from __future__ import annotations

import json

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from webapp.accounts.models import Team
from webapp.accounts.roles import can_change
from webapp.accounts.selectors import team_scoped_get
from webapp.datasets.models import Dataset

BAD_ROWS_SHOWN = 100
EXAMPLE_CHARS_SHOWN = 2_000  # of each example a preview shows: a row may hold a megabyte


def dataset_list(*, team: Team | None) -> QuerySet[Dataset]:
    if not team:  # request.team is a lazy object; test its truth
        return Dataset.objects.none()
    return Dataset.objects.filter(team=team).select_related("created_by")


def dataset_get(*, team: Team | None, dataset_id: int) -> Dataset:
    """The team's dataset `dataset_id`, or Http404 (also for another team's dataset)."""
    return team_scoped_get(Dataset.objects.all(), team=team, pk=dataset_id)


def dataset_can_delete(*, user: AbstractBaseUser, dataset: Dataset) -> bool:
    """Whether `user` may delete the dataset: a team owner, or the member who created it."""
    return can_change(user=user, team=dataset.team, created_by_id=dataset.created_by_id)


def dataset_preview(*, dataset: Dataset, chars: int = 600) -> dict[str, object]:
    """The corpus's first `chars` characters and how the tokenizer splits them (for the detail page)."""
    from tokenizers import Tokenizer

    with dataset.corpus_path.open(encoding="utf-8") as corpus:
        head = corpus.read(chars)
    tokenizer = Tokenizer.from_file(str(dataset.tokenizer_path))
    pieces = [tokenizer.decode([token]) for token in tokenizer.encode(head[:200]).ids]
    return {"text": head, "pieces": pieces}


def dataset_examples_preview(*, dataset: Dataset) -> dict[str, object]:
    """What the web worker wrote for a ready instruction dataset's page: its first training examples as
    segments (cut to `EXAMPLE_CHARS_SHOWN` characters each, ``hidden`` saying how many more there are), the
    examples too long for each max_seq_len, and the first `BAD_ROWS_SHOWN` bad rows."""
    preview = json.loads(dataset.preview_path.read_text(encoding="utf-8"))
    bad_rows = json.loads(dataset.bad_rows_path.read_text(encoding="utf-8"))[:BAD_ROWS_SHOWN]
    examples = [{**example, **_cut(example["segments"], EXAMPLE_CHARS_SHOWN)} for example in preview["examples"]]
    return {**preview, "examples": examples, "bad_rows": bad_rows}


def dataset_pairs_preview(*, dataset: Dataset) -> dict[str, object]:
    """What the web worker wrote for a ready preference dataset's page: its first training pairs, each with its
    ``prompt``, ``chosen`` and ``rejected`` messages as ``{"text", "role"}`` segments (each part cut to
    `EXAMPLE_CHARS_SHOWN` characters, its ``*_hidden`` saying how many more there are) and token counts, the pairs
    too long for each max_seq_len, and the first `BAD_ROWS_SHOWN` bad rows."""
    preview = json.loads(dataset.preview_path.read_text(encoding="utf-8"))
    bad_rows = json.loads(dataset.bad_rows_path.read_text(encoding="utf-8"))[:BAD_ROWS_SHOWN]
    pairs = []
    for pair in preview["pairs"]:
        shown = dict(pair)
        for part in ("prompt", "chosen", "rejected"):
            cut = _cut([{"text": m["content"], "role": m["role"]} for m in pair[part]], EXAMPLE_CHARS_SHOWN)
            shown[part], shown[f"{part}_hidden"] = cut["segments"], cut["hidden"]
        pairs.append(shown)
    return {**preview, "pairs": pairs, "bad_rows": bad_rows}


def _cut(segments: list[dict[str, object]], chars: int) -> dict[str, object]:
    """The first `chars` characters of `segments` (``{"text", ...}`` pieces in order, the last one shown cut) as
    ``segments``, and the characters left out as ``hidden``."""
    shown: list[dict[str, object]] = []
    left, hidden = chars, 0
    for segment in segments:
        text = str(segment["text"])
        if left <= 0:
            hidden += len(text)
            continue
        if len(text) > left:
            hidden += len(text) - left
            segment = {**segment, "text": text[:left]}
        shown.append(segment)
        left -= len(text)
    return {"segments": shown, "hidden": hidden}
