"""Roles on experiments and trials: a team's owners launch, control and delete all of them; a member only
what they created. Every action is refused by the service itself and by its page, and a refusal changes
nothing, in the database or in the scheduler."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.urls import reverse

from tests.webapp.experiments.conftest import planned
from tests.webapp.experiments.factories import draft
from tests.webapp.team_factories import join
from webapp.experiments import events, services
from webapp.ground.models import Experiment, Trial
from webapp.worker_door import TrialNotFound

pytestmark = pytest.mark.django_db


@pytest.fixture
def users(alice, alice_team, bob, charlie) -> dict[str, Any]:
    """alice owns Alice lab; bob and charlie are members of it."""
    join(alice_team, alice, bob)
    join(alice_team, alice, charlie)
    return {"alice": alice, "bob": bob, "charlie": charlie}


@dataclass(frozen=True)
class Action:
    prepare: Callable[..., None]  # (experiment, scheduler, launch) -> None: bring the first trial to a state
    call: Callable[..., object]  # (experiment, trial, actor) -> the service's answer
    url: Callable[[Experiment, Trial], str]  # the page that does it, by POST


def _launched(experiment, scheduler, launch) -> None:
    launch(experiment)


def _paused(experiment, scheduler, launch) -> None:
    launch(experiment)
    trial = experiment.trials.get(number=1)
    services.trial_control(trial=trial, action="pause", actor=experiment.team.memberships.get(role="owner").user)
    planned(scheduler, trial.queue_id)
    events.trial_event_apply(trial_id=trial.queue_id, status="paused")


def _failed(experiment, scheduler, launch) -> None:
    launch(experiment)
    events.trial_event_apply(trial_id=experiment.trials.get(number=1).queue_id, status="failed", message="boom")


def _new(experiment, scheduler, launch) -> None:
    pass


def _trial_url(name: str, action: str | None = None) -> Callable[[Experiment, Trial], str]:
    return lambda experiment, trial: reverse(name, args=[trial.pk, *([action] if action else [])])


def _experiment_url(name: str, action: str | None = None) -> Callable[[Experiment, Trial], str]:
    return lambda experiment, trial: reverse(name, args=[experiment.pk, *([action] if action else [])])


ACTIONS = {
    "pause trial": Action(_launched, lambda e, t, actor: services.trial_control(trial=t, action="pause", actor=actor),
                          _trial_url("trial_action", "pause")),
    "resume trial": Action(_paused, lambda e, t, actor: services.trial_control(trial=t, action="resume", actor=actor),
                           _trial_url("trial_action", "resume")),
    "cancel trial": Action(_launched, lambda e, t, actor: services.trial_control(trial=t, action="cancel", actor=actor),
                           _trial_url("trial_action", "cancel")),
    "retry trial": Action(_failed, lambda e, t, actor: services.trial_retry(trial=t, actor=actor),
                          _trial_url("trial_action", "retry")),
    "delete trial": Action(_launched, lambda e, t, actor: services.trial_delete(trial=t, actor=actor),
                           _trial_url("trial_delete")),
    "launch experiment": Action(_new, lambda e, t, actor: services.experiment_launch(experiment=e, actor=actor),
                                _experiment_url("experiment_action", "launch")),
    "cancel experiment": Action(_launched, lambda e, t, actor: services.experiment_cancel(experiment=e, actor=actor),
                                _experiment_url("experiment_action", "cancel")),
    "retry failed trials": Action(
        _failed, lambda e, t, actor: services.experiment_retry_failed(experiment=e, actor=actor),
        _experiment_url("experiment_action", "retry-failed")),
    "delete experiment": Action(_launched, lambda e, t, actor: services.experiment_delete(experiment=e, actor=actor),
                                _experiment_url("experiment_delete")),
}
REFUSED = [("charlie", "bob"), ("bob", "alice")]  # (who acts, who created the experiment)
ALLOWED = [("bob", "bob"), ("alice", "bob")]


@pytest.fixture
def setup(users, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    """`make(creator, action)`: an experiment `creator` made, with its first trial where `action` applies."""

    def launch(experiment: Experiment) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            services.experiment_launch(experiment=experiment, actor=users["alice"])

    def make(creator: str, action: Action) -> tuple[Experiment, Trial]:
        experiment = services.experiment_create(team=alice_team, user=users[creator],
                                                draft=draft(alice_dataset, name=f"{creator}'s sweep"))
        action.prepare(experiment, scheduler, launch)
        return experiment, experiment.trials.get(number=1)

    return make


def snapshot(experiment: Experiment, scheduler) -> tuple[bool, list[tuple[object, ...]]]:
    """Everything an action could change: whether the experiment exists, and each trial's row and its
    record in the scheduler."""
    rows = []
    for trial in Trial.objects.filter(experiment_id=experiment.pk).order_by("number"):
        try:
            record = scheduler.trial(trial.queue_id)
            queued = (record.state, record.control)
        except TrialNotFound:
            queued = None
        rows.append((trial.pk, trial.status, trial.attempt, trial.queue_id, queued))
    return Experiment.objects.filter(pk=experiment.pk).exists(), rows


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("actor, creator", REFUSED)
@pytest.mark.parametrize("name", ACTIONS)
def test_the_service_refuses_a_member_on_someone_elses_experiment(setup, users, scheduler, name, actor, creator,
                                                                  django_capture_on_commit_callbacks):
    experiment, trial = setup(creator, ACTIONS[name])
    before = snapshot(experiment, scheduler)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(PermissionDenied, match="owners"):
        ACTIONS[name].call(experiment, trial, users[actor])
    assert snapshot(experiment, scheduler) == before


@pytest.mark.parametrize("actor, creator", REFUSED)
@pytest.mark.parametrize("name", ACTIONS)
def test_the_page_refuses_a_member_on_someone_elses_experiment(setup, users, scheduler, name, actor, creator,
                                                               django_capture_on_commit_callbacks):
    experiment, trial = setup(creator, ACTIONS[name])
    before = snapshot(experiment, scheduler)
    with django_capture_on_commit_callbacks(execute=True):
        response = _client(users[actor]).post(ACTIONS[name].url(experiment, trial))
    assert response.status_code == 403
    assert "Only the team&#x27;s owners and the person who created" in response.content.decode()
    assert snapshot(experiment, scheduler) == before


@pytest.mark.parametrize("actor, creator", ALLOWED)
@pytest.mark.parametrize("name", ACTIONS)
def test_the_creator_and_the_owners_may(setup, users, scheduler, name, actor, creator,
                                        django_capture_on_commit_callbacks):
    experiment, trial = setup(creator, ACTIONS[name])
    before = snapshot(experiment, scheduler)
    with django_capture_on_commit_callbacks(execute=True):
        ACTIONS[name].call(experiment, trial, users[actor])
    assert snapshot(experiment, scheduler) != before


@pytest.mark.parametrize("actor, creator", ALLOWED)
@pytest.mark.parametrize("name", ACTIONS)
def test_the_creators_and_the_owners_pages_do_it(setup, users, scheduler, name, actor, creator,
                                                 django_capture_on_commit_callbacks):
    experiment, trial = setup(creator, ACTIONS[name])
    before = snapshot(experiment, scheduler)
    with django_capture_on_commit_callbacks(execute=True):
        response = _client(users[actor]).post(ACTIONS[name].url(experiment, trial))
    assert response.status_code == 302
    assert snapshot(experiment, scheduler) != before


@pytest.mark.parametrize("url", ["experiment_delete", "trial_delete"])
def test_a_member_is_not_offered_what_they_may_not_do(setup, users, url):
    experiment, trial = setup("alice", ACTIONS["launch experiment"])
    target = experiment if url == "experiment_delete" else trial
    assert _client(users["bob"]).get(reverse(url, args=[target.pk])).status_code == 403
    for page in [reverse("experiment_detail", args=[experiment.pk]), reverse("trial_detail", args=[trial.pk])]:
        html = _client(users["bob"]).get(page).content.decode()
        assert reverse(url, args=[target.pk]) not in html, page
        assert reverse("trial_action", args=[trial.pk, "cancel"]) not in html, page
        html = _client(users["alice"]).get(page).content.decode()
        assert reverse("trial_action", args=[trial.pk, "cancel"]) in html, page
