"""The API's lists, a page at a time: ``?limit=`` (1 to 100) and ``?offset=`` (0 to `MAX_OFFSET`).

ninja's own offset has no upper bound, and PostgreSQL's OFFSET takes a bigint: a larger number failed inside
the database (500). Past `MAX_OFFSET`, far beyond any team's list, the request is a mistake and answers 400.
"""

from __future__ import annotations

from django.conf import settings
from ninja import Field, Schema
from ninja.pagination import LimitOffsetPagination

MAX_OFFSET = 1_000_000_000


class BoundedLimitOffset(LimitOffsetPagination):
    class Input(Schema):
        limit: int = Field(settings.NINJA_PAGINATION_PER_PAGE, ge=1, le=settings.NINJA_PAGINATION_MAX_LIMIT)
        offset: int = Field(0, ge=0, le=MAX_OFFSET)
