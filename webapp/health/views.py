"""Two kinds of health page: `/health` answers up or down, to anyone (load balancers), with one more line when
`make run` restarted a service; the details (`/health/`, `/health.json`: addresses, versions, worker
processes, every restart, the host's shared LoRA bases with the trials of the viewer's team using them) are for
logged-in staff."""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from webapp.health.selectors import health_report, service_up, services_summary


def health_status(request: HttpRequest) -> HttpResponse:
    """200 ``up`` when the database and Redis answer, else 503 ``down``. A second line, only under make run,
    says which of its services exited and whether it was restarted (names, times and exit codes: nothing else)."""
    up = service_up()
    summary = services_summary()
    body = ("up\n" if up else "down\n") + (f"{summary}\n" if summary else "")
    return HttpResponse(body, content_type="text/plain", status=200 if up else 503)


def staff_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Anonymous visitors go to the login page; logged-in users who are not staff get 403."""

    @login_required
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("The health details are for staff.")
        return view(request, *args, **kwargs)

    return wrapped


@staff_only
def health_page(request: HttpRequest) -> HttpResponse:
    report = health_report(team=request.team or None)
    return render(request, "health/health.html", {"report": report}, status=200 if report.ok else 503)


@staff_only
def health_json(request: HttpRequest) -> JsonResponse:
    report = health_report(team=request.team or None)
    return JsonResponse(report.as_dict(), status=200 if report.ok else 503)
