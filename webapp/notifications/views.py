"""A team's notification page (in its team pages): where it is told about ended experiments and failed trials,
its webhook secret, and its last deliveries. Every member of the team sees it; only owners change it."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.accounts.models import Team
from webapp.accounts.selectors import membership_get, team_for_user
from webapp.datasets.http import form_add_errors
from webapp.notifications import services
from webapp.notifications.forms import NotificationSettingsForm, lines
from webapp.notifications.models import Delivery
from webapp.notifications.selectors import deliveries_recent, url_shown


def _page(request: HttpRequest, team: Team, *, form: NotificationSettingsForm | None = None,
          new_secret: str | None = None, status: int = 200) -> HttpResponse:
    membership = membership_get(user=request.user, team=team)
    is_owner = membership is not None and membership.is_owner
    row = services.settings_get(team=team)
    allowlist = settings.HYDRA.notify.webhook_allowlist
    deliveries = [(delivery, delivery.target if is_owner or delivery.channel == Delivery.Channel.EMAIL
                   else url_shown(delivery.target)) for delivery in deliveries_recent(team=team)]
    return render(request, "notifications/settings.html", {
        "team": team, "is_owner": is_owner, "row": row,
        "form": form or NotificationSettingsForm.initial_from(row.emails, row.webhook_urls),
        "webhook_urls_shown": row.webhook_urls if is_owner else [url_shown(url) for url in row.webhook_urls],
        "new_secret": new_secret, "allowlist": allowlist.describe() if allowlist else "",
        "retry_s": settings.HYDRA.notify.retry_s, "deliveries": deliveries,
    }, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def notification_settings(request: HttpRequest, team_id: int) -> HttpResponse:
    team = team_for_user(user=request.user, team_id=team_id)
    if request.method == "GET":
        return _page(request, team)
    form = NotificationSettingsForm(request.POST)
    if form.is_valid():
        try:
            _, new_secret = services.settings_save(team=team, actor=request.user,
                                                   emails=lines(form.cleaned_data["emails"]),
                                                   webhook_urls=lines(form.cleaned_data["webhook_urls"]))
        except ValidationError as error:
            form_add_errors(form, error)
        else:
            if new_secret:  # shown in this answer only, never put in a redirect, a message or a log
                return _page(request, team, new_secret=new_secret)
            messages.success(request, "Notification settings saved.")
            return redirect("notification_settings", team_id=team.pk)
    return _page(request, team, form=form, status=400)


@login_required
@require_POST
def notification_secret_rotate(request: HttpRequest, team_id: int) -> HttpResponse:
    team = team_for_user(user=request.user, team_id=team_id)
    return _page(request, team, new_secret=services.secret_rotate(team=team, actor=request.user))
