"""Team pages: list, create and choose teams; answer invitations; see members and (owners) manage them."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from webapp.accounts import services
from webapp.accounts.forms import InvitationForm, MemberForm, RoleForm, TeamCreateForm, TeamSwitchForm
from webapp.accounts.selectors import (
    invitations_for_team,
    invitations_for_user,
    membership_get,
    team_for_user,
    user_teams,
)

INVITED = "If that user exists, they have been invited."


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    form = TeamCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            team = services.team_create(name=form.cleaned_data["name"], owner=request.user)
        except ValidationError as error:
            form.add_error("name", error)
        else:
            messages.success(request, f"Team {team.name} created; you are working in it.")
            return redirect("team_detail", team_id=team.pk)
    return render(request, "accounts/team_list.html", {
        "teams": user_teams(user=request.user),
        "invitations": invitations_for_user(user=request.user),
        "form": form,
    })


@login_required
@require_POST
def team_switch(request: HttpRequest) -> HttpResponse:
    form = TeamSwitchForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a team.")
        return redirect("team_list")
    team = services.current_team_set(user=request.user, team_id=form.cleaned_data["team"])
    messages.success(request, f"Now working in {team.name}.")
    return redirect(request.POST["next"] if _safe_next(request) else "home")


def _safe_next(request: HttpRequest) -> bool:
    target = request.POST.get("next", "")
    return bool(target) and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )


@login_required
def team_detail(request: HttpRequest, team_id: int) -> HttpResponse:
    team = team_for_user(user=request.user, team_id=team_id)
    membership = membership_get(user=request.user, team=team)
    is_owner = membership is not None and membership.is_owner
    return render(request, "accounts/team_detail.html", {
        "team": team,
        "memberships": team.memberships.select_related("user"),
        "is_owner": is_owner,
        "invitations": invitations_for_team(team=team) if is_owner else [],
        "invite_form": InvitationForm(),
    })


def _error(request: HttpRequest, error: ValidationError) -> None:
    messages.error(request, " ".join(error.messages))


@login_required
@require_POST
def member_add(request: HttpRequest, team_id: int) -> HttpResponse:
    """Invite a username (owners only). The reply never says whether the username belongs to anyone."""
    team = team_for_user(user=request.user, team_id=team_id)
    form = InvitationForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give a username and a role.")
        return redirect("team_detail", team_id=team.pk)
    try:
        services.invitation_send(team=team, actor=request.user, username=form.cleaned_data["username"],
                                 role=form.cleaned_data["role"])
    except ValidationError as error:
        _error(request, error)
    else:
        messages.success(request, INVITED)
    return redirect("team_detail", team_id=team.pk)


@login_required
@require_POST
def invitation_withdraw(request: HttpRequest, team_id: int, invitation_id: int) -> HttpResponse:
    team = team_for_user(user=request.user, team_id=team_id)
    services.invitation_withdraw(team=team, actor=request.user, invitation_id=invitation_id)
    messages.success(request, "Invitation withdrawn.")
    return redirect("team_detail", team_id=team.pk)


@login_required
@require_POST
def invitation_accept(request: HttpRequest, invitation_id: int) -> HttpResponse:
    membership = services.invitation_accept(user=request.user, invitation_id=invitation_id)
    team = membership.team
    if membership.is_current:
        messages.success(request, f"You joined {team.name} and are working in it.")
    else:
        messages.success(request, f"You joined {team.name}. Choose it from the team menu to work in it.")
    return redirect("team_detail", team_id=team.pk)


@login_required
@require_POST
def invitation_decline(request: HttpRequest, invitation_id: int) -> HttpResponse:
    team = services.invitation_decline(user=request.user, invitation_id=invitation_id)
    messages.success(request, f"You declined the invitation to {team.name}.")
    return redirect("team_list")


@login_required
@require_POST
def member_remove(request: HttpRequest, team_id: int) -> HttpResponse:
    team = team_for_user(user=request.user, team_id=team_id)
    form = MemberForm(request.POST)
    if form.is_valid():
        try:
            services.membership_remove(team=team, actor=request.user, username=form.cleaned_data["username"])
        except ValidationError as error:
            _error(request, error)
        else:
            messages.success(request, f"{form.cleaned_data['username']} removed from {team.name}.")
    return redirect("team_detail", team_id=team.pk)


@login_required
@require_POST
def member_role(request: HttpRequest, team_id: int) -> HttpResponse:
    team = team_for_user(user=request.user, team_id=team_id)
    form = RoleForm(request.POST)
    if form.is_valid():
        try:
            membership = services.membership_role_set(team=team, actor=request.user,
                                                      username=form.cleaned_data["username"],
                                                      role=form.cleaned_data["role"])
        except ValidationError as error:
            _error(request, error)
        else:
            messages.success(request, f"{membership.user.get_username()} is now {membership.get_role_display()}.")
    else:
        messages.error(request, "Give a username and a role.")
    return redirect("team_detail", team_id=team.pk)
