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

from webapp.accounts.selectors import user_teams

View = Callable[..., HttpResponse]


def team_required(view: View) -> View:
    """Login required, and a current team: a user who has not chosen one is sent to the teams page to choose,
    create or join one. Nothing picks a team for them, so their work never lands in a team they did not pick."""

    @login_required
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.team:  # type: ignore[attr-defined]  # a lazy object: test its truth, not identity
            if user_teams(user=request.user).exists():
                messages.error(request, "Choose the team to work in first.")
            else:
                messages.error(request, "You are not in a team yet: create one, or accept a team owner's "
                                        "invitation.")
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
