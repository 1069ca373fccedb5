from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from webapp.health.selectors import health_report


def health_page(request: HttpRequest) -> HttpResponse:
    report = health_report()
    return render(request, "health/health.html", {"report": report}, status=200 if report.ok else 503)


def health_json(request: HttpRequest) -> JsonResponse:
    report = health_report()
    return JsonResponse(report.as_dict(), status=200 if report.ok else 503)
