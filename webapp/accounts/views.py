"""Team pages: list and switch teams, see members, and (owners) add or remove them."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from webapp.accounts import services
from webapp.accounts.forms import MemberAddForm, MemberRemoveForm, TeamCreateForm, TeamSwitchForm
from webapp.accounts.middleware import SESSION_KEY
from webapp.accounts.selectors import membership_get, team_for_user, user_teams


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "accounts/home.html", {"teams": user_teams(user=request.user)})


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    form = TeamCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            team = services.team_create(name=form.cleaned_data["name"], owner=request.user)
        except ValidationError as error:
            form.add_error("name", error)
        else:
            request.session[SESSION_KEY] = team.pk
            messages.success(request, f"Team {team.name} created.")
            return redirect("team_detail", team_id=team.pk)
    return render(request, "accounts/team_list.html", {"teams": user_teams(user=request.user), "form": form})


@login_required
@require_POST
def team_switch(request: HttpRequest) -> HttpResponse:
    form = TeamSwitchForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a team.")
        return redirect("team_list")
    team = team_for_user(user=request.user, team_id=form.cleaned_data["team"])
    request.session[SESSION_KEY] = team.pk
    messages.success(request, f"Now working in {team.name}.")
    return redirect(request.POST.get("next") if _safe_next(request) else "home")


def _safe_next(request: HttpRequest) -> bool:
    from django.utils.http import url_has_allowed_host_and_scheme

    target = request.POST.get("next", "")
    return bool(target) and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )


@login_required
def team_detail(request: HttpRequest, team_id: int) -> HttpResponse:
    team = team_for_user(user=request.user, team_id=team_id)
    membership = membership_get(user=request.user, team=team)
    add_form = MemberAddForm()
    return render(
        request,
        "accounts/team_detail.html",
        {
            "team": team,
            "memberships": team.memberships.select_related("user"),
            "is_owner": membership is not None and membership.is_owner,
            "add_form": add_form,
        },
    )


@login_required
@require_POST
def member_add(request: HttpRequest, team_id: int) -> HttpResponse:
    team = team_for_user(user=request.user, team_id=team_id)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            services.membership_add(
                team=team, actor=request.user, username=form.cleaned_data["username"], role=form.cleaned_data["role"]
            )
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
        else:
            messages.success(request, f"{form.cleaned_data['username']} added to {team.name}.")
    else:
        messages.error(request, "Give a username and a role.")
    return redirect("team_detail", team_id=team.pk)


@login_required
@require_POST
def member_remove(request: HttpRequest, team_id: int) -> HttpResponse:
    team = team_for_user(user=request.user, team_id=team_id)
    form = MemberRemoveForm(request.POST)
    if form.is_valid():
        try:
            services.membership_remove(team=team, actor=request.user, username=form.cleaned_data["username"])
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
        else:
            messages.success(request, f"{form.cleaned_data['username']} removed from {team.name}.")
    return redirect("team_detail", team_id=team.pk)
