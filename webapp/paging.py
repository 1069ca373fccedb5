"""Pages of the lists that grow without bound (experiments, an experiment's trials, leaderboards, the lab
queue's waiting trials): one page size for all, and the page a request asks for.

Every such page reads a fixed number of rows whatever the list's length, so its queries and its time do not
grow with the lab's history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet

PAGE_SIZE = 50


def page_get(items: QuerySet[Any] | Sequence[Any], number: object, *, per_page: int = PAGE_SIZE) -> Page:
    """The page `number` of `items` (a query string's value: the first page when it is missing or not a
    number, the last when it is past the end). A queryset is counted once and read one page at a time."""
    return Paginator(items, per_page).get_page(number)
