from __future__ import annotations

from django import forms

from webapp.accounts.models import Membership


class TeamCreateForm(forms.Form):
    name = forms.CharField(max_length=80)


class InvitationForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150)


class RoleForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Membership.Role.choices)


class TeamSwitchForm(forms.Form):
    team = forms.IntegerField(min_value=1)
