"""How the web apps turn access rules and domain errors into HTTP: used by datasets, experiments, leaderboards."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

View = Callable[..., HttpResponse]


def team_required(view: View) -> View:
    """Login required, and a current team: a user in no team is sent to the teams page to make or join one."""

    @login_required
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.team:  # type: ignore[attr-defined]  # a lazy object: test its truth, not identity
            messages.error(request, "You are not in a team yet: create one, or ask a team owner to add you.")
            return redirect("team_list")
        return view(request, *args, **kwargs)

    return wrapper


def form_add_errors(form: forms.Form, error: ValidationError) -> None:
    """Attach a service's ValidationError to `form`: field errors to their fields (when the form has them)."""
    if hasattr(error, "error_dict"):
        for field, errors in error.error_dict.items():
            form.add_error(field if field in form.fields else None, errors)
    else:
        form.add_error(None, error)
