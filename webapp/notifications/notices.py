"""Recording what a team is told, in the transaction that changed the trial (an outbox).

`trial_ended` is called by `webapp.experiments.events.trial_event_apply`, the one writer of a launched trial's
status, inside its transaction with the trial's row locked. It only writes rows: a `Notice` and one
`Delivery` per address and URL of the team, whose task the web worker gets once the transaction commits
(`webapp.background.outbox.work_enqueue`). Nothing here waits on a mail server or a webhook, so applying an
event takes no longer for a team that is notified.

Each notice is recorded once, whatever number of times its event is applied: a trial's failure once per
attempt, an experiment's end once per set of attempts. When every trial of an experiment has ended
(finished, failed or cancelled) it ends; a retried trial makes it run again, and its next end is a new end
and is notified again. Ends are counted under the experiment's row lock, so two trials that end at once in
two transactions give one end, not none or two.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Count, Sum
from django.urls import reverse
from django.utils import timezone

from webapp.background.outbox import work_enqueue
from webapp.ground.models import Experiment, Trial
from webapp.notifications.models import Delivery, Notice, NotificationSettings


def trial_ended(*, trial: Trial) -> None:
    """Record the notices that `trial`'s new status gives its team, if the team asked for any: "trial.failed"
    when it failed, "experiment.ended" when it was the last of its experiment's trials to end. Call it in the
    transaction that applied the status, after any trials that status starts (TPE) are created."""
    if trial.status not in Trial.ENDED:
        return
    experiment = trial.experiment
    targets = _targets(experiment.team_id)
    if not targets:
        return
    if trial.status == Trial.Status.FAILED:
        payload = _payload(Notice.Event.TRIAL_FAILED, experiment, trial=trial)
        _record(experiment, Notice.Event.TRIAL_FAILED, f"trial:{trial.pk}:{trial.attempt}:failed", payload, targets)
    Experiment.objects.select_for_update().filter(pk=experiment.pk).values_list("pk").get()  # ends one at a time
    trials = Trial.objects.filter(experiment=experiment)
    if trials.exclude(status__in=Trial.ENDED).exists():
        return
    launches = trials.aggregate(total=Sum("attempt"))["total"] or 0
    payload = _payload(Notice.Event.EXPERIMENT_ENDED, experiment)
    _record(experiment, Notice.Event.EXPERIMENT_ENDED, f"experiment:{experiment.pk}:ended:{launches}", payload,
            targets)


def _targets(team_id: int) -> list[tuple[str, str]]:
    row = NotificationSettings.objects.filter(team_id=team_id).values("emails", "webhook_urls").first()
    if row is None:
        return []
    return ([(Delivery.Channel.EMAIL, email) for email in row["emails"]]
            + [(Delivery.Channel.WEBHOOK, url) for url in row["webhook_urls"]])


def _record(experiment: Experiment, event: str, key: str, payload: dict[str, Any],
            targets: list[tuple[str, str]]) -> None:
    notice, created = Notice.objects.get_or_create(
        team_id=experiment.team_id, key=key, defaults={"event": event, "experiment": experiment, "payload": payload})
    if not created:
        return
    for channel, target in targets:
        delivery = Delivery.objects.create(team_id=experiment.team_id, notice=notice, channel=channel, target=target)
        work_enqueue(row=delivery)


def _payload(event: str, experiment: Experiment, *, trial: Trial | None = None) -> dict[str, Any]:
    counts = dict(Trial.objects.filter(experiment=experiment).values_list("status").annotate(n=Count("pk")))
    team = experiment.team
    payload: dict[str, Any] = {
        "event": event,
        "team": {"id": team.pk, "name": team.name},
        "experiment": {"id": experiment.pk, "name": experiment.name, "url": experiment_url(experiment)},
        "trial_counts": {status: counts.get(status, 0) for status in Trial.Status.values if counts.get(status)},
        "time": timezone.now().isoformat(),
    }
    if trial is not None:
        payload["trial"] = {"number": trial.number, "attempt": trial.attempt, "status": trial.status,
                            "message": trial.message}
    return payload


def experiment_url(experiment: Experiment) -> str:
    return settings.HYDRA.notify.public_url + reverse("experiment_detail", args=[experiment.pk])
