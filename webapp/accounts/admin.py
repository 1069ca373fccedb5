from django.contrib import admin

from webapp.accounts.models import Invitation, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class InvitationInline(admin.TabularInline):
    model = Invitation
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "created"]
    inlines = [MembershipInline, InvitationInline]
