"""ETags on the API's answers, so that a client polling an unchanged resource gets a 304 without a body."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.middleware.http import ConditionalGetMiddleware

API_PREFIX = "/api/"


class ApiConditionalGetMiddleware(ConditionalGetMiddleware):
    """Django's conditional GET (an ETag from the body; 304 on If-None-Match) for the API's paths only: the
    pages carry messages and CSRF tokens that must not be answered from a cache."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return response
        return super().process_response(request, response)
