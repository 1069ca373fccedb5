"""The pages of the API: a user's tokens (make one, see it once, revoke), and a team's audit log (owners)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.accounts.roles import require_owner
from webapp.accounts.selectors import team_for_user
from webapp.api.models import AccessToken, AuditEntry
from webapp.api.tokens import MAX_DAYS, token_create, token_list, token_revoke
from webapp.datasets.http import form_add_errors
from webapp.paging import page_get


class TokenForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="What will use it: a laptop, a CI job.")
    scope = forms.ChoiceField(choices=AccessToken.Scope.choices, initial=AccessToken.Scope.READ)
    days = forms.IntegerField(min_value=1, max_value=MAX_DAYS, initial=30, label="Expires after (days)")


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    secret = None
    if request.method == "POST" and form.is_valid():
        try:
            _, secret = token_create(user=request.user, **form.cleaned_data)
        except ValidationError as error:
            form_add_errors(form, error)
        else:
            form = TokenForm()
    return render(request, "api/tokens.html", {
        "form": form, "secret": secret, "tokens": token_list(user=request.user),
    }, status=400 if form.errors else 200)


@login_required
@require_POST
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    token = token_revoke(user=request.user, token_id=token_id)
    messages.success(request, f"Token {token.name} revoked: it no longer works.")
    return redirect("api_tokens")


@login_required
def team_audit(request: HttpRequest, team_id: int) -> HttpResponse:
    """What was written through the API in the team: its owners only."""
    team = team_for_user(user=request.user, team_id=team_id)
    require_owner(user=request.user, team=team, action="read the API audit log")
    page = page_get(AuditEntry.objects.filter(team=team), request.GET.get("page"))
    return render(request, "api/audit.html", {"team": team, "page": page})
