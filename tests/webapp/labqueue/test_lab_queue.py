"""The lab queue page on the real shard queue (no device worker: the test plans and claims as devices would).

One host, one device, two teams. The team whose id sorts first (`leader`) wins the replay's opening tie, as
`fair_share.team_turn` breaks ties by name; its long trial runs, its shorter one waits behind it and its third
waits for its quota of 2. The other team's short trial waits for its turn by fair share, a large one waits for
host memory and a third is paused.
"""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass

import pytest
from django.urls import reverse

from tests.webapp.telemetry.factories import make_experiment
from tests.webapp.web_worker import CLOSED_PORT_URL, redis_at
from webapp.accounts.models import Team
from webapp.experiments.templatetags.hydra_format import duration
from webapp.ground.models import Trial
from webapp.labqueue import selectors
from webapp.labqueue.figures import shares_figure
from webapp.telemetry.models import UnitSpan
from worker.contract import SyntheticJob
from worker.scheduling.policy import TrialLoad, timetable
from worker.scheduling.queue import ShardQueue

pytestmark = pytest.mark.django_db

UNITS = {"L1": 20, "L2": 10, "O1": 5, "O3": 8}  # remaining units, of 1 s each


@dataclass
class Lab:
    leader: Team
    other: Team
    trials: dict[str, Trial]  # L1 L2 L3 of the leader, O1 O2 O3 of the other team

    def team_of(self, name: str) -> Team:
        return self.leader if name.startswith("L") else self.other

    def name_of(self, queue_id: str) -> str:
        return next(name for name, trial in self.trials.items() if trial.queue_id == queue_id)


def _submit(queue: ShardQueue, lab: Lab, name: str, host_bytes: int = 100) -> None:
    queue.submit(trial_id=lab.trials[name].queue_id, job=SyntheticJob(units=50), export_dir="/nonexistent",
                 team=str(lab.team_of(name).pk), host_bytes=host_bytes)


@pytest.fixture
def lab(scheduler: ShardQueue, alice_team: Team, bob_team: Team) -> Lab:
    leader, other = sorted([alice_team, bob_team], key=lambda t: str(t.pk))
    trials: dict[str, Trial] = {}
    for prefix, team in (("L", leader), ("O", other)):
        experiment = make_experiment(team, name=f"secret {prefix} sweep", status="planning",
                                     trials=[{"lr": 0.0011}, {"lr": 0.0022}, {"lr": 0.0033}])
        for trial in experiment.trials.order_by("number"):
            trials[f"{prefix}{trial.number}"] = trial
    lab = Lab(leader, other, trials)
    scheduler.configure(capacity_bytes=1000)
    scheduler.set_quotas({str(leader.pk): 2})
    scheduler.device_start("cpu0", "e1")
    scheduler.survey("cpu0", "e1")  # the device serves the host now
    for name in ("L1", "L2", "O1", "O3"):
        _submit(scheduler, lab, name)
    while (job := scheduler.claim_plan("cpu0")) is not None:
        scheduler.plan_done(job, remaining_units=UNITS[lab.name_of(job.trial_id)], unit_s=1.0, plan={"shards": []})
    scheduler.pause(trials["O3"].queue_id)
    assert scheduler.claim(trials["L1"].queue_id, "cpu0") is not None
    _submit(scheduler, lab, "L3")  # its team holds 2 places, its quota
    time.sleep(0.002)  # a later millisecond (the queue's clock): waiting behind L3, not tied with it
    _submit(scheduler, lab, "O2", host_bytes=950)  # 400 of the 1000 bytes are taken
    assert scheduler.claim_plan("cpu0") is None
    return lab


def _expected_slots(lab: Lab) -> list:
    loads = [TrialLoad(lab.trials[name].queue_id, UNITS[name], 1.0, team=str(lab.team_of(name).pk))
             for name in ("L1", "L2", "O1")]
    return list(timetable(loads, ["cpu0"], {}))


def test_waiting_trials_are_ordered_by_the_replayed_schedule_with_why_each_waits(lab: Lab, alice_team: Team) -> None:
    queue = selectors.lab_queue(team=alice_team)
    assert [(lab.name_of(row.trial.queue_id), row.reason) for row in queue.waiting] == [
        ("O1", "fair_share"), ("L2", "team_order"), ("L3", "quota"), ("O2", "memory"), ("O3", "paused")]
    assert queue.waiting[2].detail.startswith("Waits for a place: its team has 2 trials")
    assert queue.waiting[3].detail.startswith("Waits for host memory")
    [device] = queue.devices
    assert (device.name, device.online, device.state) == ("cpu0", True, "running")
    assert device.trial is not None and device.trial.queue_id == lab.trials["L1"].queue_id

    slots = _expected_slots(lab)
    first = {}
    for slot in slots:
        first.setdefault(slot.trial_id, slot.start)
    last = {slot.trial_id: slot.end for slot in slots}
    timed = [row for row in queue.waiting if row.timing is not None]
    assert [row.trial.queue_id for row in timed] == sorted(
        (lab.trials[n].queue_id for n in ("O1", "L2")), key=lambda queue_id: first[queue_id])
    for row in timed:
        assert (row.timing.start_s, row.timing.end_s) == (first[row.trial.queue_id], last[row.trial.queue_id])
    assert first[lab.trials["O1"].queue_id] == 1.0  # after one unit of the leader's, its turn
    assert device.end_s == last[lab.trials["L1"].queue_id]
    assert all(row.timing is None for row in queue.waiting[2:])


def test_the_page_names_only_the_viewers_own_trials(lab: Lab, alice_client, alice_team: Team) -> None:
    page = html.unescape(alice_client.get(reverse("lab_queue")).content.decode())
    own, other = ("L", "O") if lab.leader == alice_team else ("O", "L")
    assert f"secret {own} sweep #2" in page
    assert reverse("trial_detail", args=[lab.trials[f"{own}2"].pk]) in page
    assert f"secret {other} sweep" not in page
    for number in (1, 2, 3):
        assert reverse("trial_detail", args=[lab.trials[f"{other}{number}"].pk]) not in page
        assert f'data-queue-id="{lab.trials[f"{other}{number}"].queue_id}"' not in page
    assert "0.0011" not in page and "lr=" not in page  # no trial's parameters
    assert page.count("another team's trial") == 3 + (1 if other == "L" else 0)  # its 3, and the device's
    assert 'data-reason="fair_share"' in page and "Team quota" in page and "Host memory" in page
    assert '<a href="/queue/">Queue</a>' in page


def test_the_experiment_page_shows_each_active_trials_estimated_end(lab: Lab, alice_client, alice_team: Team) -> None:
    mine = "L" if lab.leader == alice_team else "O"
    last = {slot.trial_id: slot.end for slot in _expected_slots(lab)}
    experiment = lab.trials[f"{mine}1"].experiment
    page = alice_client.get(reverse("experiment_detail", args=[experiment.pk])).content.decode()
    cells = dict(re.findall(r'<tr data-trial="(\d+)".*?<td data-field="eta">(.*?)</td>', page, re.S))
    for number in (1, 2, 3):
        trial = lab.trials[f"{mine}{number}"]
        assert cells[str(trial.pk)] == duration(last.get(trial.queue_id)), number  # a dash when unknown
    running = lab.trials[f"{mine}1"] if mine == "L" else lab.trials["O1"]
    assert cells[str(running.pk)] != duration(None)
    detail = alice_client.get(reverse("trial_detail", args=[running.pk])).content.decode()
    assert f'<dd id="trial-eta">{duration(last[running.queue_id])}' in detail


def test_with_redis_down_the_page_says_so(settings, alice_client) -> None:
    with redis_at(settings, CLOSED_PORT_URL):
        response = alice_client.get(reverse("lab_queue"))
    assert response.status_code == 200
    assert "The scheduler cannot be reached" in response.content.decode()


def test_a_user_in_no_team_sees_every_trial_as_another_teams(lab: Lab, charlie) -> None:
    queue = selectors.lab_queue(team=None)
    assert {row.trial.label for row in queue.waiting} == {selectors.OTHER_TEAM}
    assert all(row.trial.trial_pk is None for row in queue.waiting)


def _span(trial: Trial, host: str, start: float, end: float, n: int) -> UnitSpan:
    return UnitSpan(trial=trial, host=host, entry_id=f"{n}-0", device="cpu0", unit=n, step=0, micro_batch=0,
                    phase="F", shard=0, start=start, end=end, bytes_moved=0, peak_bytes=0)


def test_the_teams_shares_of_device_time_come_from_the_stored_spans(settings, alice_team, bob_team) -> None:
    host, now, day = settings.HYDRA.worker.host_id, time.time(), 86400.0
    alice_team.share_weight, bob_team.share_weight = 3.0, 1.0
    alice_team.save()
    bob_team.save()
    a = make_experiment(alice_team, name="a").trials.get()
    b = make_experiment(bob_team, name="b").trials.get()
    UnitSpan.objects.bulk_create([
        _span(a, host, now - 7200, now - 3600, 1),  # alice: an hour, today
        _span(b, host, now - 1800, now, 2),  # bob: half an hour today...
        _span(b, host, now - day - 600, now - day + 600, 3),  # ...10 minutes today of one across the day's start
        _span(b, host, now - 3 * day, now - 3 * day + 4800, 4),  # ...and 80 minutes three days ago
        _span(b, host, now - 9 * day, now - 8 * day, 5),  # more than a week ago: not counted
        _span(a, "another-host", now - 600, now, 6),  # another host's devices: not counted
    ])
    shares = {s.name: s for s in selectors.team_shares(now=now)}
    alice, bob = shares["Alice lab"], shares["Bob lab"]
    assert alice.seconds == {"day": pytest.approx(3600), "week": pytest.approx(3600)}
    assert bob.seconds == {"day": pytest.approx(2400), "week": pytest.approx(1800 + 1200 + 4800)}
    assert (alice.share["day"], bob.share["day"]) == (pytest.approx(0.6), pytest.approx(0.4))
    assert (alice.share["week"], bob.share["week"]) == (pytest.approx(3600 / 11400), pytest.approx(7800 / 11400))
    assert (alice.weight_share, bob.weight_share) == (0.75, 0.25)
    figure = shares_figure([alice, bob])
    bars = {trace["meta"]["role"]: trace["y"] for trace in figure["data"]}
    assert figure["data"][0]["x"] == ["Alice lab", "Bob lab"]
    assert bars == {"day": [60.0, 40.0], "week": [31.58, 68.42], "weight": [75.0, 25.0]}
