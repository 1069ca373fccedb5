"""Create the demo team and user on first start and print how to log in (used by ``make run``)."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand

from webapp.accounts.services import demo_team_ensure

DEMO_USERNAME = "demo"
DEMO_TEAM = "Demo lab"


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: object, **options: object) -> None:
        login_file = settings.HYDRA.data_dir / "demo-login.txt"
        password = secrets.token_urlsafe(12)
        user, created = demo_team_ensure(username=DEMO_USERNAME, password=password, team_name=DEMO_TEAM)
        if created:
            # On a fresh `make run` the demo user is the lab's only one, so it also adds models to the catalog.
            user.user_permissions.add(Permission.objects.get(content_type__app_label="catalog",
                                                             codename="manage_catalog"))
            if get_user_model().objects.count() == 1:
                # ... and it is the lab's administrator: staff, who read the health details.
                user.is_staff = True
                user.save(update_fields=["is_staff"])
            login_file.parent.mkdir(parents=True, exist_ok=True)
            login_file.write_text(f"{DEMO_USERNAME} {password}\n")
            login_file.chmod(0o600)
        if login_file.exists():
            username, password = login_file.read_text().split()
            self.stdout.write(f"hydra: log in as {username} / {password}")
        else:
            self.stdout.write(
                f"hydra: log in as {DEMO_USERNAME} (reset its password with: manage.py changepassword {DEMO_USERNAME})"
            )
