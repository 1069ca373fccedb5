"""Teams own everything in Hydra; a user works inside one of their teams at a time.

Nobody joins a team without saying yes: an owner sends an `Invitation`, and only the invitee's acceptance
makes a `Membership`. The team a user works in (`Membership.is_current`) changes only when they choose it
(by switching, creating a team, or accepting an invitation while they have no current team); leaving or
being removed from it leaves them with none, and they are asked to choose again.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class Team(models.Model):
    name = models.CharField(max_length=80, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")
    share_weight = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.01), MaxValueValidator(1000.0)],
        help_text="The team's share of device time against other teams with work (fair share): a team of "
                  "weight 3 gets three times the device time of a team of weight 1. Takes effect at the next "
                  "unit boundary.")
    max_host_gib = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.001)],
        help_text="The most host memory (GiB) this team's trials' spill stores take on a host at once; more wait "
                  "to be planned, they never fail for it. Empty: no quota.")
    max_trials = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="The most trials of this team a host holds at once (planned and not ended); more wait to be "
                  "planned, they never fail for it. Empty: no quota.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def limits(cls) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
        """Every team's fair-share weight, and the quotas of trials and of host bytes of the teams that have
        them, by team id (as the scheduler knows teams)."""
        rows = cls.objects.values_list("pk", "share_weight", "max_trials", "max_host_gib")
        return ({str(pk): weight for pk, weight, _, _ in rows},
                {str(pk): most for pk, _, most, _ in rows if most is not None},
                {str(pk): int(gib * (1 << 30)) for pk, _, _, gib in rows if gib is not None})


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        MEMBER = "member", "Member"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    joined = models.DateTimeField(auto_now_add=True)
    is_current = models.BooleanField(default=False, help_text="The team this user works in now (one at most).")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="unique_team_member"),
            models.UniqueConstraint(fields=["user"], condition=models.Q(is_current=True),
                                    name="one_current_team_per_user"),
        ]
        ordering = ["team__name", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"

    @property
    def is_owner(self) -> bool:
        return self.role == self.Role.OWNER


class Invitation(models.Model):
    """An owner's offer of a role in `team` to whoever has the username `username`.

    It names a username rather than a user so that inviting a name nobody has looks, to the owner, exactly
    like inviting one somebody has: the team's pending list shows both, and neither says whether the account
    exists. An account with that name, now or later, sees it and may accept or decline.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    username = models.CharField(max_length=150)
    role = models.CharField(max_length=10, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "username"], name="unique_team_invitation")]
        ordering = ["team__name", "username"]

    def __str__(self) -> str:
        return f"{self.username} invited to {self.team} ({self.role})"
