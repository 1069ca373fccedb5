from django.contrib import admin, messages

from webapp import queue_client
from webapp.accounts.models import Invitation, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class InvitationInline(admin.TabularInline):
    model = Invitation
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "share_weight", "max_trials", "max_host_gib", "created"]
    list_editable = ["share_weight", "max_trials", "max_host_gib"]
    inlines = [MembershipInline, InvitationInline]

    def save_model(self, request, obj, form, change) -> None:  # type: ignore[no-untyped-def]
        super().save_model(request, obj, form, change)
        if {"share_weight", "max_trials", "max_host_gib"} & set(form.changed_data):
            _weights_send(request)

    def delete_model(self, request, obj) -> None:  # type: ignore[no-untyped-def]
        super().delete_model(request, obj)
        _weights_send(request)


def _weights_send(request) -> None:  # type: ignore[no-untyped-def]
    """Tell the scheduler the teams' weights and quotas now; if it cannot be reached, the next reconcile pass
    does."""
    try:
        queue_client.team_limits_send(*Team.limits())
    except queue_client.SchedulerUnavailable as error:
        messages.warning(request, f"Saved; the scheduler will take the new limits when it can be reached ({error}).")
