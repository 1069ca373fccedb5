"""Team limits: staff set a team's fair-share weight and quota in the admin and the scheduler has them at once."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from tests.webapp.experiments.conftest import scheduler  # noqa: F401 -- a fixture
from webapp.health.models import HostCapacity

pytestmark = pytest.mark.django_db


def test_a_weight_and_quota_saved_in_the_admin_reach_the_scheduler_and_bad_ones_are_refused(
        client, alice_team, bob_team, scheduler) -> None:  # noqa: F811
    admin = get_user_model().objects.create_superuser("root", "root@example.org", "a-long-pass-phrase")
    client.force_login(admin)
    url = reverse("admin:accounts_team_change", args=[bob_team.pk])
    form = {"name": bob_team.name, "share_weight": "2.5", "max_trials": "3", "max_host_gib": "0.5",
            "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
            "invitations-TOTAL_FORMS": "0", "invitations-INITIAL_FORMS": "0"}
    assert client.post(url, form).status_code == 302
    assert scheduler.client.hgetall(scheduler.key("weights")) == {str(alice_team.pk): "1.0",
                                                                  str(bob_team.pk): "2.5"}
    assert scheduler.client.hgetall(scheduler.key("quotas")) == {str(bob_team.pk): "3"}
    assert scheduler.client.hgetall(scheduler.key("byte_quotas")) == {str(bob_team.pk): str(1 << 29)}
    response = client.post(url, form | {"share_weight": "0"})
    assert response.status_code == 200 and b"greater than or equal to 0.01" in response.content
    assert client.post(url, form | {"max_trials": "0"}).status_code == 200
    bob_team.refresh_from_db()
    assert (bob_team.share_weight, bob_team.max_trials) == (2.5, 3)


def test_a_host_capacity_set_in_the_admin_reaches_that_host_s_scheduler_and_goes_when_deleted(
        client, scheduler) -> None:  # noqa: F811
    admin = get_user_model().objects.create_superuser("root", "root@example.org", "a-long-pass-phrase")
    client.force_login(admin)
    form = {"host_id": scheduler.host_id, "capacity_gib": "2"}
    assert client.post(reverse("admin:health_hostcapacity_add"), form).status_code == 302
    assert scheduler.load().capacity_bytes == 2 << 30
    assert client.post(reverse("admin:health_hostcapacity_add"),
                       {"host_id": "other", "capacity_gib": "0"}).status_code == 200  # refused: not above 0
    capacity = HostCapacity.objects.get()
    delete = reverse("admin:health_hostcapacity_delete", args=[capacity.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 302
    assert scheduler.client.hget(scheduler.key("config"), "capacity_override_bytes") is None
