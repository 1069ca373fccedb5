"""Delivering a notice to one e-mail address or webhook URL, in the web worker, with retries.

`delivery_run` is the task's body. It claims the delivery (counting the try, and leasing it for
`ATTEMPT_LEASE` so that a second message for it meanwhile does nothing), tries once with no row lock held,
and records the outcome: delivered; failed for good (an address the allowlist refuses, an e-mail address
that is not one bare address, a redirect, a target the team has since removed, or the last retry spent); or
due again after the next wait of ``HYDRA_NOTIFY_RETRY_SECONDS``. A retry is sent by the telemetry ingest's
pass over the web worker's pending work (`webapp.background.reconcile`), which sends every pending row whose
``resend_at`` has come, so no message waits in Redis for hours and a worker that died mid-try is covered once
the lease ends.

Webhooks are POSTed with `http.client` to the addresses `allowlist.url_check` resolved and vetted (so a name
that resolves elsewhere between the check and the connection is never followed), with `TIMEOUT_S` to connect
and to read, redirects never followed. The body is the notice's JSON; the headers sign it:

    X-Hydra-Timestamp: <unix seconds of this try>
    X-Hydra-Signature: sha256=<hex HMAC-SHA256, keyed with the team's secret (UTF-8), of
                       "<timestamp>." followed by the raw body bytes>
    X-Hydra-Delivery: <uuid, the same on every try of this delivery>
    X-Hydra-Event: trial.failed | experiment.ended
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
import smtplib
import socket
import ssl
import time
import unicodedata
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from webapp.allowlist import Target, WebhookRefused, url_check
from webapp.notifications.email_address import AddressRefused, email_address_check
from webapp.notifications.models import Delivery, Notice, NotificationSettings

TIMEOUT_S = 5.0  # to connect, and for each read of the answer
ATTEMPT_LEASE = timedelta(seconds=60)  # longer than a try takes: no second try of a delivery starts meanwhile
ERROR_CHARS = 500
USER_AGENT = "Hydra-Webhook/1"
log = logging.getLogger(__name__)


class Outcome(NamedTuple):
    error: str = ""  # empty: delivered
    final: bool = False  # a failure that a retry would only repeat


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Hydra-Signature`` value of `body` sent at `timestamp` (what a receiver recomputes)."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def delivery_run(*, delivery_id: int, now: datetime | None = None) -> str | None:
    """Try delivery `delivery_id` if it is pending and due; returns its status afterwards (None when this call
    did not try it: delivered, failed, not found, not due, or tried by another call right now)."""
    now = now or timezone.now()
    with transaction.atomic():
        delivery = (Delivery.objects.select_for_update(skip_locked=True).select_related("notice")
                    .filter(pk=delivery_id, status=Delivery.Status.PENDING).first())
        if delivery is None or (delivery.next_attempt_at is not None and delivery.next_attempt_at > now):
            return None
        delivery.attempts += 1
        delivery.next_attempt_at = delivery.resend_at = now + ATTEMPT_LEASE
        delivery.send_attempts = 0  # its message arrived: the outbox counts sends anew from here
        delivery.save(update_fields=["attempts", "next_attempt_at", "resend_at", "send_attempts"])
    outcome = _attempt(delivery)
    done = timezone.now()
    retries: tuple[float, ...] = settings.HYDRA.notify.retry_s
    if not outcome.error:
        fields: dict[str, Any] = {"status": Delivery.Status.DELIVERED, "delivered_at": done, "message": "",
                                  "next_attempt_at": None, "resend_at": None}
    elif outcome.final or delivery.attempts > len(retries):
        fields = {"status": Delivery.Status.FAILED, "message": outcome.error, "next_attempt_at": None,
                  "resend_at": None}
    else:
        due = done + timedelta(seconds=retries[delivery.attempts - 1])
        fields = {"message": outcome.error, "next_attempt_at": due, "resend_at": due, "send_attempts": 0,
                  "send_error": ""}
    Delivery.objects.filter(pk=delivery.pk, status=Delivery.Status.PENDING).update(**fields)
    if outcome.error:
        log.info("notification %s to %s, try %s: %s", delivery.uid, delivery.target, delivery.attempts, outcome.error)
    return fields.get("status", Delivery.Status.PENDING)


def _attempt(delivery: Delivery) -> Outcome:
    team_settings = NotificationSettings.objects.filter(team_id=delivery.team_id).first()
    if delivery.channel == Delivery.Channel.EMAIL:
        if team_settings is None or delivery.target not in team_settings.emails:
            return Outcome("The team no longer notifies this address.", final=True)
        try:
            address = email_address_check(delivery.target)
        except AddressRefused as error:  # stored by another way than the team's form, which refuses it
            return Outcome(f"Refused: {error}", final=True)
        return _email(address, delivery.notice)
    if team_settings is None or delivery.target not in team_settings.webhook_urls:
        return Outcome("The team no longer notifies this URL.", final=True)
    if not team_settings.secret:
        return Outcome("The team has no webhook secret to sign with.", final=True)
    return _webhook(delivery, team_settings.secret)


def _webhook(delivery: Delivery, secret: str) -> Outcome:
    try:
        target = url_check(delivery.target, settings.HYDRA.notify.webhook_allowlist)
    except WebhookRefused as error:
        return Outcome(f"Refused: {error}", final=True)
    body = json.dumps(delivery.notice.payload, sort_keys=True, separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json", "User-Agent": USER_AGENT,
        "X-Hydra-Event": delivery.notice.event, "X-Hydra-Delivery": str(delivery.uid),
        "X-Hydra-Timestamp": timestamp, "X-Hydra-Signature": signature(secret, timestamp, body),
    }
    path = (target.url.path or "/") + (f"?{target.url.query}" if target.url.query else "")
    connection = _connection(target)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        answer = response.read(ERROR_CHARS).decode(errors="replace").strip()
    except (OSError, http.client.HTTPException) as error:
        return Outcome(f"{type(error).__name__}: {error}"[:ERROR_CHARS] if str(error) else type(error).__name__)
    finally:
        connection.close()
    if 200 <= response.status < 300:
        return Outcome()
    if 300 <= response.status < 400:
        where = response.getheader("Location", "")
        return Outcome(f"Answered HTTP {response.status} (a redirect{f' to {where}' if where else ''}); webhooks "
                       "do not follow redirects: save the URL it redirects to.", final=True)
    return Outcome(f"Answered HTTP {response.status}{f': {answer}' if answer else ''}"[:ERROR_CHARS])


def _connection(target: Target) -> http.client.HTTPConnection:
    if target.url.scheme.lower() == "https":
        return _PinnedHTTPSConnection(target, context=ssl.create_default_context())
    return _PinnedHTTPConnection(target)


def _connect(target: Target) -> socket.socket:
    """A connection to the first of the target's vetted addresses that answers."""
    error: OSError | None = None
    for address in target.addresses:
        try:
            return socket.create_connection((address, target.port), timeout=TIMEOUT_S)
        except OSError as refused:
            error = refused
    raise error or OSError(f"no address to connect to for {target.host}")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to the addresses the allowlist vetted, never to what the name resolves to later."""

    def __init__(self, target: Target) -> None:
        super().__init__(target.host, target.port, timeout=TIMEOUT_S)
        self._target = target

    def connect(self) -> None:
        self.sock = _connect(self._target)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to the vetted addresses, verifying the certificate for the URL's host name."""

    def __init__(self, target: Target, *, context: ssl.SSLContext) -> None:
        super().__init__(target.host, target.port, timeout=TIMEOUT_S, context=context)
        self._target = target
        self._tls = context

    def connect(self) -> None:
        self.sock = self._tls.wrap_socket(_connect(self._target), server_hostname=self._target.host)


def _email(address: str, notice: Notice) -> Outcome:
    subject, text = email_text(notice.payload)
    try:
        send_mail(subject, text, None, [address], fail_silently=False)
    except (smtplib.SMTPException, OSError) as error:
        return Outcome(f"{type(error).__name__}: {error}"[:ERROR_CHARS])
    except ValueError as error:  # Django's BadHeaderError, or an address it cannot encode: a retry fails alike
        return Outcome(f"Refused: {type(error).__name__}: {error}"[:ERROR_CHARS], final=True)
    return Outcome()


def email_text(payload: dict[str, Any]) -> tuple[str, str]:
    """The subject and plain-text body of the e-mail of a notice's payload."""
    experiment = payload["experiment"]
    counts = ", ".join(f"{n} {status}" for status, n in payload.get("trial_counts", {}).items()) or "no trials"
    if payload["event"] == Notice.Event.TRIAL_FAILED:
        trial = payload["trial"]
        subject = f"[Hydra] Trial #{trial['number']} of {experiment['name']} failed"
        lines = [f"Trial #{trial['number']} of experiment {experiment['name']} (team {payload['team']['name']}) "
                 "failed:", "", trial.get("message") or "(no message)", ""]
    else:
        subject = f"[Hydra] Experiment {experiment['name']} ended: {counts}"
        lines = [f"Every trial of experiment {experiment['name']} (team {payload['team']['name']}) has ended.", ""]
    lines += [f"Trials: {counts}.", f"Experiment: {experiment['url']}", "",
              "You get this because your team's notification settings list this address."]
    return _one_line(subject)[:200], "\n".join(lines)


def _one_line(text: str) -> str:
    """`text` with every run of whitespace, control or invisible characters made one space: an experiment's
    name goes into the Subject header, which a line break would end."""
    return " ".join("".join(" " if unicodedata.category(ch)[0] in "CZ" else ch for ch in text).split())
