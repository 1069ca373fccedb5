"""The administrator's notification settings: which webhook addresses are allowed (none by default), the retry
waits and the e-mail backend, each bad value stopping start-up with its name."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from django.core.exceptions import ImproperlyConfigured

from webapp.allowlist import WebhookRefused, allowlist_parse, url_check
from webapp.config import load

DEV = {"DEBUG": "1"}


def _resolving(*addresses: str):
    """A resolver that answers `addresses` for any name, as DNS would."""
    def resolve(host, port, type=0):
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in addresses]
    return resolve


def test_by_default_no_webhook_is_allowed_and_development_mails_go_to_the_console():
    config = load(DEV).notify
    assert not config.webhook_allowlist
    assert config.email.backend == "django.core.mail.backends.console.EmailBackend"
    assert config.retry_s == (10.0, 60.0, 300.0, 1800.0, 7200.0)
    with pytest.raises(WebhookRefused, match="allows no webhook addresses"):
        url_check("https://hooks.example.org/x", config.webhook_allowlist, resolve=_resolving("192.0.2.1"))


def test_it_reads_host_names_networks_retries_and_smtp():
    config = load({"SECRET_KEY": "s" * 50, "ALLOWED_HOSTS": "hydra.lab.example",
                   "HYDRA_WEBHOOK_ALLOWED_HOSTS": " Hooks.Example.org, 10.0.0.0/8 ,2001:db8::/32,192.0.2.7",
                   "HYDRA_NOTIFY_RETRY_SECONDS": "1,2.5", "EMAIL_HOST": "smtp.lab.example", "EMAIL_USE_TLS": "1",
                   "DEFAULT_FROM_EMAIL": "hydra@lab.example"}).notify
    assert [str(h) for h in config.webhook_allowlist.hosts] == ["hooks.example.org"]
    assert [str(n) for n in config.webhook_allowlist.networks] == ["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"]
    assert config.retry_s == (1.0, 2.5)
    assert (config.email.backend, config.email.host, config.email.port, config.email.use_tls) == (
        "django.core.mail.backends.smtp.EmailBackend", "smtp.lab.example", 587, True)
    assert config.public_url == "https://hydra.lab.example"
    assert load({**DEV, "HYDRA_NOTIFY_RETRY_SECONDS": "off"}).notify.retry_s == ()
    assert load({**DEV, "CSRF_TRUSTED_ORIGINS": "https://hydra.lab.org"}).notify.public_url == "https://hydra.lab.org"


@pytest.mark.parametrize(("environ", "named"), [
    ({**DEV, "HYDRA_WEBHOOK_ALLOWED_HOSTS": "10.0.0.1/8"}, "HYDRA_WEBHOOK_ALLOWED_HOSTS"),
    ({**DEV, "HYDRA_WEBHOOK_ALLOWED_HOSTS": "hooks.example.org,not a host"}, "HYDRA_WEBHOOK_ALLOWED_HOSTS"),
    ({**DEV, "HYDRA_WEBHOOK_ALLOWED_HOSTS": "300.1.2.3"}, "HYDRA_WEBHOOK_ALLOWED_HOSTS"),
    ({**DEV, "HYDRA_NOTIFY_RETRY_SECONDS": "10,soon"}, "HYDRA_NOTIFY_RETRY_SECONDS"),
    ({**DEV, "HYDRA_NOTIFY_RETRY_SECONDS": "-1"}, "HYDRA_NOTIFY_RETRY_SECONDS"),
    ({**DEV, "HYDRA_PUBLIC_URL": "hydra.lab.org"}, "HYDRA_PUBLIC_URL"),
    ({**DEV, "EMAIL_BACKEND": "carrier-pigeon"}, "EMAIL_BACKEND"),
    ({**DEV, "EMAIL_USE_TLS": "1", "EMAIL_USE_SSL": "1"}, "EMAIL_USE_TLS"),
    ({**DEV, "EMAIL_PORT": "0"}, "EMAIL_PORT"),
])
def test_it_names_the_bad_variable(environ, named):
    with pytest.raises(ImproperlyConfigured, match=named):
        load(environ)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8080/hook", "http://localhost/hook", "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/hook", "http://10.0.0.5/hook", "https://internal.lab.example/hook"])
def test_an_address_outside_the_allowed_networks_is_refused(url):
    allowlist = allowlist_parse("hooks.example.org,192.0.2.0/24")
    resolve = _resolving("10.0.0.5") if "lab.example" in url or "localhost" in url else socket.getaddrinfo
    with pytest.raises(WebhookRefused, match="does not allow webhooks"):
        url_check(url, allowlist, resolve=resolve)


def test_a_listed_host_name_is_allowed_whatever_it_resolves_to_and_other_names_only_inside_the_networks():
    allowlist = allowlist_parse("hooks.example.org,192.0.2.0/24")
    target = url_check("https://HOOKS.example.org/x", allowlist, resolve=_resolving("10.1.2.3"))
    assert (target.host, target.port, target.addresses) == ("hooks.example.org", 443, ("10.1.2.3",))
    assert url_check("http://other.example/x", allowlist, resolve=_resolving("192.0.2.9")).addresses == ("192.0.2.9",)
    with pytest.raises(WebhookRefused, match=r"resolves to 127\.0\.0\.1"):  # one forbidden address is enough
        url_check("http://other.example/x", allowlist, resolve=_resolving("192.0.2.9", "127.0.0.1"))
    assert ipaddress.ip_address("192.0.2.9") in allowlist.networks[0].network


@pytest.mark.parametrize(("url", "why"), [
    ("ftp://hooks.example.org/x", "not an http"), ("file:///etc/passwd", "not an http"),
    ("https:///x", "names no host"), ("https://user:pw@hooks.example.org/x", "no user name or password"),
    ("https://hooks.example.org/" + "a" * 2000, "at most 2000"), ("https://hooks.example.org:99999/", "port"),
    ("https://hooks.example.org/a b", "no spaces")])
def test_a_malformed_url_is_refused(url, why):
    with pytest.raises(WebhookRefused, match=why):
        url_check(url, allowlist_parse("hooks.example.org"), resolve=_resolving("192.0.2.1"))
