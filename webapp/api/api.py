"""The API object: its routers, its security, and one shape for every error.

Every error answers ``{"detail": "...", "errors": {field: [messages]}}``: a bad input 400 (with the form's
own messages), no or a dead token 401, a refused role or scope 403, an unknown object or another team's 404,
no team chosen 409, too many requests 429, the scheduler out of reach 503. Nothing answers 500 for the
caller's input.
"""

from __future__ import annotations

from datetime import datetime

from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, Throttled
from ninja.errors import ValidationError as SchemaError
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder

from webapp import queue_client
from webapp.api import datasets, experiments, lab, trials
from webapp.api.auth import TokenAuth, TokenRateThrottle, TooManyFailures


class TimeEncoder(NinjaJSONEncoder):
    """Times in ISO 8601 to the microsecond with their offset (Django's encoder cuts them to milliseconds), so
    that a time read back as a cursor (``updated_since``) selects exactly what came after it."""

    def default(self, o: object) -> object:
        if isinstance(o, datetime):
            return o.isoformat()
        return super().default(o)


class Renderer(JSONRenderer):
    encoder_class = TimeEncoder


api = NinjaAPI(
    title="Hydra API", version="1", urls_namespace="api", auth=TokenAuth(), throttle=[TokenRateThrottle()],
    renderer=Renderer(),
    description="Datasets, models, experiments, trials, leaderboards and the lab queue of a Hydra server. "
                "Authenticate with a personal access token (`Authorization: Bearer hyd_…`), made on the "
                "server's tokens page. Requests act in the team named by the `X-Hydra-Team` header, or else "
                "in the caller's current team.",
)
api.add_router("", lab.router)
api.add_router("/datasets", datasets.router)
api.add_router("/experiments", experiments.router)
api.add_router("/trials", trials.router)


def _error(request: HttpRequest, status: int, detail: str, errors: dict[str, list[str]] | None = None,
           ) -> HttpResponse:
    return api.create_response(request, {"detail": detail, "errors": errors or {}}, status=status)


@api.exception_handler(SchemaError)
def _schema_error(request: HttpRequest, error: SchemaError) -> HttpResponse:
    errors: dict[str, list[str]] = {}
    for item in error.errors:
        location = [str(part) for part in item.get("loc", ()) if part not in ("body", "query", "path", "form",
                                                                                "payload", "data")]
        errors.setdefault(".".join(location) or "__all__", []).append(str(item.get("msg", "invalid")))
    return _error(request, 400, "The request's values are not valid.", errors)


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, error: ValidationError) -> HttpResponse:
    if hasattr(error, "error_dict"):
        errors = {field: [m for e in items for m in e.messages] for field, items in error.error_dict.items()}
        return _error(request, 400, " ".join(m for ms in errors.values() for m in ms), errors)
    return _error(request, 400, " ".join(error.messages))


@api.exception_handler(MultiPartParserError)
def _bad_multipart(request: HttpRequest, error: MultiPartParserError) -> HttpResponse:
    return _error(request, 400, f"The upload is not readable multipart/form-data: {error}")


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, error: AuthenticationError) -> HttpResponse:
    response = _error(request, 401, "Send a live personal access token: Authorization: Bearer hyd_… (it may be "
                                    "unknown, revoked or expired).")
    response["WWW-Authenticate"] = "Bearer"
    return response


@api.exception_handler(PermissionDenied)
def _denied(request: HttpRequest, error: PermissionDenied) -> HttpResponse:
    return _error(request, 403, str(error) or "Not allowed.")


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, error: Http404) -> HttpResponse:
    return _error(request, 404, str(error) or "Not found.")


@api.exception_handler(Throttled)
def _throttled(request: HttpRequest, error: Throttled) -> HttpResponse:
    response = _error(request, 429, "Too many requests with this token; wait and try again.")
    if error.wait:
        response["Retry-After"] = str(max(1, int(error.wait + 0.999)))
    return response


@api.exception_handler(TooManyFailures)
def _too_many_failures(request: HttpRequest, error: TooManyFailures) -> HttpResponse:
    response = _error(request, 429, "Too many wrong tokens were sent from your address; wait and try again with a "
                                    "live token (make one on your tokens page).")
    response["Retry-After"] = str(max(1, int(error.wait + 0.999)))
    return response


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, error: HttpError) -> HttpResponse:
    return _error(request, error.status_code, str(error))


@api.exception_handler(queue_client.SchedulerError)
def _scheduler(request: HttpRequest, error: queue_client.SchedulerError) -> HttpResponse:
    status = 503 if isinstance(error, queue_client.SchedulerUnavailable) else 409
    return _error(request, status, str(error))
