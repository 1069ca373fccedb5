"""Webhook ports: an allowlist entry allows only its scheme's default port (80 for http://, 443 for https://)
unless it names another, so listing the loopback for a web server never lets a webhook talk to Redis or any
other local service; checked when a URL is saved and again at each try of a delivery."""

from __future__ import annotations

import re
import socket

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse

from tests.webapp.notifications.conftest import notify_settings, trials_of
from webapp.allowlist import WebhookRefused, allowlist_parse, url_check
from webapp.config import load
from webapp.experiments.events import trial_event_apply
from webapp.notifications import services as notify_services
from webapp.notifications.delivery import delivery_run
from webapp.notifications.models import Delivery, NotificationSettings

DEV = {"DEBUG": "1"}
LOOPBACK = "localhost,127.0.0.1,::1"


def _resolving(*addresses: str):
    """A resolver that answers `addresses` for any name, as DNS would."""
    def resolve(host, port, type=0):
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in addresses]
    return resolve


def _allowed(url: str, allowlist: str, *addresses: str) -> bool:
    try:
        url_check(url, allowlist_parse(allowlist), resolve=_resolving(*addresses or ("127.0.0.1",)))
    except WebhookRefused:
        return False
    return True


@pytest.mark.parametrize("url", [
    "http://localhost:6379/", "http://127.0.0.1:6379/", "http://[::1]:6379/", "https://localhost:5432/",
    "http://localhost:443/", "https://localhost:80/", "http://localhost:8080/hook"])
def test_a_listed_loopback_allows_no_other_port_than_the_schemes_default(url):
    assert not _allowed(url, LOOPBACK)


@pytest.mark.parametrize("url", [
    "http://localhost/hook", "http://localhost:80/hook", "https://localhost/hook", "https://127.0.0.1:443/hook",
    "http://[::1]/hook"])
def test_the_schemes_default_port_written_or_implied_is_allowed(url):
    assert _allowed(url, LOOPBACK, "::1" if "[::1]" in url else "127.0.0.1")


def test_an_entry_that_names_a_port_allows_that_port_only():
    assert _allowed("http://localhost:8080/hook", "localhost:8080")
    assert not _allowed("http://localhost/hook", "localhost:8080")
    assert not _allowed("http://localhost:6379/", "localhost:8080")
    assert _allowed("http://localhost/hook", "localhost:8080,localhost")  # listed twice: both ports

    assert _allowed("http://10.1.2.3:9000/", "10.0.0.0/8:9000", "10.1.2.3")
    assert _allowed("http://internal.lab.example:9000/", "10.0.0.0/8:9000", "10.1.2.3")
    assert not _allowed("http://internal.lab.example/", "10.0.0.0/8:9000", "10.1.2.3")
    assert not _allowed("http://10.1.2.3:6379/", "10.0.0.0/8:9000", "10.1.2.3")

    assert _allowed("http://[::1]:8080/", "[::1]:8080", "::1")
    assert not _allowed("http://[::1]/", "[::1]:8080", "::1")
    assert _allowed("https://[2001:db8::7]:9443/", "[2001:db8::/32]:9443", "2001:db8::7")
    assert _allowed("http://192.0.2.7:8080/", "192.0.2.7:8080", "192.0.2.7")


def test_a_host_name_listed_for_another_port_falls_back_to_the_networks_for_this_one():
    assert _allowed("http://hooks.example.org:8080/", "hooks.example.org,192.0.2.0/24:8080", "192.0.2.9")
    with pytest.raises(WebhookRefused, match="on port 6379"):
        url_check("http://hooks.example.org:6379/", allowlist_parse("hooks.example.org,192.0.2.0/24:8080"),
                  resolve=_resolving("192.0.2.9"))


def test_the_setting_reads_ports_and_says_which_entries_allow_which():
    allowlist = load({**DEV, "HYDRA_WEBHOOK_ALLOWED_HOSTS":
                      "hooks.example.org, Localhost:8080, 10.0.0.0/8:9000, [::1]:8080, 2001:db8::/32, [::1]"
                      }).notify.webhook_allowlist
    assert [(h.name, h.port) for h in allowlist.hosts] == [("hooks.example.org", None), ("localhost", 8080)]
    assert [(str(n.network), n.port) for n in allowlist.networks] == [
        ("10.0.0.0/8", 9000), ("::1/128", 8080), ("2001:db8::/32", None), ("::1/128", None)]
    assert allowlist.describe() == ("hooks.example.org, localhost:8080, 10.0.0.0/8:9000, [::1]:8080, "
                                    "2001:db8::/32, ::1")
    assert allowlist_parse(allowlist.describe()) == allowlist  # what the page shows is a valid setting


@pytest.mark.parametrize("entry", [
    "localhost:0", "localhost:65536", "localhost:http", "localhost:", "10.0.0.0/8:-1", "[::1]:99999",
    "[::1]8080", "[::1", "[hooks.example.org]:80", "localhost:\uff18\uff10"])  # fullwidth digits
def test_a_bad_port_stops_start_up_naming_the_setting_and_the_entry(entry):
    with pytest.raises(ImproperlyConfigured, match=re.escape(f"HYDRA_WEBHOOK_ALLOWED_HOSTS: {entry!r}")):
        load({**DEV, "HYDRA_WEBHOOK_ALLOWED_HOSTS": f"hooks.example.org,{entry}"})


def test_a_url_with_port_zero_is_refused():
    with pytest.raises(WebhookRefused, match="invalid port"):
        url_check("http://localhost:0/", allowlist_parse("localhost"), resolve=_resolving("127.0.0.1"))


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["http://localhost:6379/", "http://127.0.0.1:6379/", "http://127.0.0.1:22/x"])
def test_the_page_refuses_a_local_service_on_another_port(alice_client, alice_team, settings, url):
    notify_settings(settings, allowed="localhost,127.0.0.1")
    answer = alice_client.post(reverse("notification_settings", args=[alice_team.pk]), {"webhook_urls": url})
    assert answer.status_code == 400
    assert "on port" in answer.content.decode() and "does not allow webhooks" in answer.content.decode()
    assert not NotificationSettings.objects.filter(team=alice_team).exists()


@pytest.mark.django_db
def test_the_page_saves_a_url_on_the_port_its_entry_names(alice_client, alice_team, settings, receiver):
    notify_settings(settings, allowed=receiver.allowed)
    answer = alice_client.post(reverse("notification_settings", args=[alice_team.pk]),
                               {"webhook_urls": receiver.url})
    assert answer.status_code == 200
    assert NotificationSettings.objects.get(team=alice_team).webhook_urls == [receiver.url]
    page = alice_client.get(reverse("notification_settings", args=[alice_team.pk])).content.decode()
    assert f'<code id="webhook-allowlist">{receiver.allowed}</code>' in page


@pytest.mark.django_db
def test_a_delivery_to_a_port_no_longer_allowed_is_refused_and_the_port_never_reached(
        alice_team, alice_dataset, launched, receiver, settings):
    notify_settings(settings, allowed=receiver.allowed)
    by_name = receiver.url.replace("127.0.0.1", "localhost")  # a name that resolves to the loopback
    notify_services.settings_save(team=alice_team, actor=alice_team.memberships.get().user, emails=[],
                                  webhook_urls=[receiver.url, by_name])
    notify_settings(settings, allowed="localhost,127.0.0.1")  # the administrator drops the receiver's port
    experiment = launched(alice_team, alice_dataset, space={"lr": {"values": [0.001]}, "batch_size": {"values": [2]}})
    trial_event_apply(trial_id=trials_of(experiment)[0].queue_id, status="finished")

    for delivery in Delivery.objects.all():
        assert delivery_run(delivery_id=delivery.pk) == "failed"
    assert receiver.received == []
    messages = dict(Delivery.objects.values_list("target", "message"))
    assert f"does not allow webhooks to 127.0.0.1 on port {receiver.port}" in messages[receiver.url]
    assert f"does not allow webhooks to localhost (it resolves to 127.0.0.1) on port {receiver.port}" in \
        messages[by_name]
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {1}  # refused for good, not retried
