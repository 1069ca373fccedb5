"""The lists a lab opens every day, at the size of a busy lab: each page shows a page of rows (`PAGE_SIZE`) with
links to the others, reads the same number of queries with a few trials and experiments as with many (a row's
data comes in the page's queries, not in a query per row), and other teams' trials are still never named.

The query counts are taken at a small size, then again once the lab has grown past a page and past what the
lab queue's estimate replays (`MAX_REPLAY_TRIALS`). Each page is loaded once before it is counted, so that
one-time work (the first read of the scheduler's events creates its cursor) is not counted.
"""

from __future__ import annotations

import html
import itertools
import math
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments import conftest as experiment_fixtures
from webapp.accounts.models import Team
from webapp.datasets.models import Dataset
from webapp.ground.models import Experiment, Trial
from webapp.labqueue.estimates import MAX_REPLAY_TRIALS
from webapp.paging import PAGE_SIZE
from worker.contract import SyntheticJob
from worker.scheduling.queue import ShardQueue

pytestmark = pytest.mark.django_db
data_dir = experiment_fixtures.data_dir  # a data folder per test (autouse)
scheduler = experiment_fixtures.scheduler  # the real shard queue under a throw-away host

SMALL, LARGE = 5, 70  # trials or experiments: less than a page, and more than a page and than the replay takes
MOST_QUERIES = 16  # what any of these pages may read (session, user, team, its rows, counts, the events cursor)
STATUSES = ["finished", "failed", "running", "runnable", "new", "cancelled"]
_numbers = itertools.count(1)

assert SMALL < PAGE_SIZE < LARGE and LARGE > MAX_REPLAY_TRIALS


def add_experiments(team: Team, dataset: Dataset, *, count: int, trials_each: int) -> list[Experiment]:
    """`count` experiments of `trials_each` trials in every status, with validation results, in two inserts."""
    now = timezone.now()
    experiments = Experiment.objects.bulk_create([
        Experiment(team=team, name=f"sweep {next(_numbers)}", dataset=dataset,
                   model={"kind": "preset", "preset": "tiny"},
                   search_space={"lr": {"kind": "logfloat", "low": 1e-4, "high": 1e-2}},
                   strategy=Experiment.Strategy.RANDOM, n_trials=trials_each, budget=100, eval_every=10, launched=now)
        for _ in range(count)
    ])
    add_trials(experiments, trials_each=trials_each)
    return experiments


def add_trials(experiments: list[Experiment], *, trials_each: int, first: int = 1) -> list[Trial]:
    """`trials_each` trials in each of `experiments`, numbered from `first`, in every status in turn, each with
    a validation result and its first attempt's queue id."""
    trials = Trial.objects.bulk_create([
        Trial(experiment=e, number=number, params={"lr": 1e-3 * number}, status=STATUSES[number % len(STATUSES)],
              attempt=1, total_steps=100, step=number % 100, best_val_loss=2.0 + 1 / number,
              best_val_ppl=math.exp(2.0 + 1 / number), final_loss=2.0 + 1 / number,
              final_ppl=math.exp(2.0 + 1 / number), final_bpb=(2.0 + 1 / number) / math.log(2), finished=timezone.now())
        for e in experiments for number in range(first, first + trials_each)
    ])
    for trial in trials:
        trial.queue_id = str(trial.pk)
    Trial.objects.bulk_update(trials, ["queue_id"])
    return trials


def queries(client: Client, url: str) -> int:
    """The queries of one GET of `url` (after a first, uncounted one); the page must answer 200."""
    assert client.get(url).status_code == 200
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured.captured_queries)


def test_the_experiment_list_reads_the_same_with_70_experiments_as_with_5(alice_client, alice_team) -> None:
    dataset = make_dataset(alice_team)
    url = reverse("experiment_list")
    add_experiments(alice_team, dataset, count=SMALL, trials_each=3)
    small = queries(alice_client, url)
    add_experiments(alice_team, dataset, count=LARGE - SMALL, trials_each=3)
    assert queries(alice_client, url) == small <= MOST_QUERIES
    assert queries(alice_client, url + "?page=2") == small


def test_an_experiment_page_reads_the_same_with_70_trials_as_with_5(alice_client, alice_team, scheduler) -> None:
    [experiment] = add_experiments(alice_team, make_dataset(alice_team), count=1, trials_each=SMALL)
    url = reverse("experiment_detail", args=[experiment.pk])
    small = queries(alice_client, url)
    add_trials([experiment], trials_each=LARGE - SMALL, first=SMALL + 1)
    assert queries(alice_client, url) == small <= MOST_QUERIES
    assert queries(alice_client, url + "?page=2") == small


def test_the_leaderboard_reads_the_same_with_70_trials_a_team_as_with_5(alice_client, alice_team, bob_team) -> None:
    alice_data, bob_data = make_dataset(alice_team), make_dataset(bob_team)  # the same corpus: comparable
    url = reverse("leaderboard", args=[alice_data.pk])
    alice_experiments = add_experiments(alice_team, alice_data, count=1, trials_each=SMALL)
    bob_experiments = add_experiments(bob_team, bob_data, count=1, trials_each=SMALL)
    small = queries(alice_client, url)
    add_trials(alice_experiments + bob_experiments, trials_each=LARGE - SMALL, first=SMALL + 1)
    assert queries(alice_client, url) == small <= MOST_QUERIES
    assert queries(alice_client, url + "?metric=val_loss&page=2") == small


def _queue(queue: ShardQueue, trials: list[Trial]) -> None:
    """Submit and plan `trials` as a device would: they wait for their turn on the host's one device."""
    for trial in trials:
        queue.submit(trial_id=trial.queue_id, job=SyntheticJob(units=50), export_dir="/nonexistent",
                     team=str(trial.experiment.team_id), host_bytes=0)
    while (job := queue.claim_plan("cpu0")) is not None:
        queue.plan_done(job, remaining_units=10 + int(job.trial_id) % 7, unit_s=1.0, plan={"shards": []})


def test_the_lab_queue_reads_the_same_with_70_waiting_trials_as_with_5(alice_client, alice_team, bob_team,
                                                                       scheduler: ShardQueue) -> None:
    scheduler.device_start("cpu0", "e1")
    scheduler.survey("cpu0", "e1")  # the device serves the host now
    [mine] = add_experiments(alice_team, make_dataset(alice_team), count=1, trials_each=SMALL)
    [theirs] = add_experiments(bob_team, make_dataset(bob_team), count=1, trials_each=LARGE)
    _queue(scheduler, list(mine.trials.all()))
    url = reverse("lab_queue")
    small = queries(alice_client, url)
    _queue(scheduler, list(theirs.trials.all()))
    assert queries(alice_client, url) == small <= MOST_QUERIES
    assert queries(alice_client, url + "?page=2") == small


def test_the_experiment_list_shows_the_newest_50_a_page_with_their_trial_counts(alice_client, alice_team,
                                                                             bob_team) -> None:
    experiments = add_experiments(alice_team, make_dataset(alice_team), count=LARGE, trials_each=6)
    add_experiments(bob_team, make_dataset(bob_team), count=1, trials_each=1)
    first = alice_client.get(reverse("experiment_list")).content.decode()
    shown = re.findall(r'<a href="/experiments/(\d+)/">', first)
    newest = Experiment.objects.filter(team=alice_team).order_by("-created", "-pk")
    assert shown == [str(pk) for pk in newest.values_list("pk", flat=True)[:PAGE_SIZE]]
    assert f"1\N{EN DASH}{PAGE_SIZE} of {LARGE}" in first and 'href="?page=2" rel="next"' in first
    # one of each status: 6 trials, 2 active (running, queued), 1 finished, 1 failed
    assert re.search(rf'/experiments/{experiments[-1].pk}/">[^<]*</a>.*?<td>6</td>\s*<td>2</td>\s*<td>1</td>\s*'
                     r'<td><span class="bad">1</span></td>', first, re.S)
    last = alice_client.get(reverse("experiment_list") + "?page=2").content.decode()
    assert len(re.findall(r'<a href="/experiments/(\d+)/">', last)) == LARGE - PAGE_SIZE
    assert 'rel="prev"' in last and 'rel="next"' not in last
    past_the_end = alice_client.get(reverse("experiment_list") + "?page=99").content.decode()
    assert re.findall(r'<a href="/experiments/(\d+)/">', past_the_end) == re.findall(
        r'<a href="/experiments/(\d+)/">', last)
    assert alice_client.get(reverse("experiment_list") + "?page=x").content.decode().count("/experiments/") == (
        first.count("/experiments/"))
    assert "sweep" in first and not Experiment.objects.filter(team=bob_team, name__in=re.findall(
        r'">(sweep \d+)</a>', first + last)).exists()


def test_an_experiments_trials_are_listed_50_a_page_by_number(alice_client, alice_team) -> None:
    [experiment] = add_experiments(alice_team, make_dataset(alice_team), count=1, trials_each=LARGE)
    url = reverse("experiment_detail", args=[experiment.pk])
    numbers = {t.pk: t.number for t in experiment.trials.all()}
    first = alice_client.get(url).content.decode()
    assert [numbers[int(pk)] for pk in re.findall(r'<tr data-trial="(\d+)"', first)] == list(range(1, PAGE_SIZE + 1))
    assert 'href="?page=2#trials" rel="next"' in first and f"({LARGE})" in first
    second = alice_client.get(url + "?page=2").content.decode()
    assert [numbers[int(pk)] for pk in re.findall(r'<tr data-trial="(\d+)"', second)] == list(
        range(PAGE_SIZE + 1, LARGE + 1))


def test_the_leaderboard_ranks_on_across_pages_and_names_no_other_teams_trials(alice_client, alice_team,
                                                                             bob_team) -> None:
    alice_data, bob_data = make_dataset(alice_team), make_dataset(bob_team)
    add_experiments(alice_team, alice_data, count=1, trials_each=LARGE)
    [bob_experiment] = add_experiments(bob_team, bob_data, count=1, trials_each=LARGE)
    bob_experiment.name = "bob private sweep"
    bob_experiment.save()
    url = reverse("leaderboard", args=[alice_data.pk])
    pages = [html.unescape(alice_client.get(url + f"?metric=val_loss&page={n}").content.decode()) for n in (1, 2)]
    ranks = [re.findall(r'<td class="rank">(\d+)</td>', page) for page in pages]
    # each page: its rows of the team's board, then one row per team on the cross-team board
    assert ranks[0] == [str(n) for n in range(1, PAGE_SIZE + 1)] + ["1", "2"]
    assert ranks[1] == [str(n) for n in range(PAGE_SIZE + 1, LARGE + 1)] + ["1", "2"]
    first = alice_client.get(url + "?metric=val_loss").content.decode()
    assert 'href="?metric=val_loss&amp;page=2" rel="next"' in first
    cross = re.search(r'id="cross-board">(.*?)</table>', pages[0], re.S).group(1)
    assert re.findall(r"<td>(\w+ lab)</td>", cross) == ["Alice lab", "Bob lab"]  # tied: the earlier finish first
    for page in pages:
        assert "bob private sweep" not in page
        assert not any(reverse("trial_detail", args=[t.pk]) in page for t in bob_experiment.trials.all())


def test_the_lab_queue_lists_the_waiting_trials_50_a_page_and_says_which_it_estimated(
        alice_client, alice_team, bob_team, scheduler: ShardQueue) -> None:
    scheduler.device_start("cpu0", "e1")
    scheduler.survey("cpu0", "e1")
    [mine] = add_experiments(alice_team, make_dataset(alice_team), count=1, trials_each=SMALL)
    [theirs] = add_experiments(bob_team, make_dataset(bob_team), count=1, trials_each=LARGE)
    _queue(scheduler, list(mine.trials.all()) + list(theirs.trials.all()))
    url = reverse("lab_queue")
    pages = [html.unescape(alice_client.get(url + f"?page={n}").content.decode()) for n in (1, 2)]
    positions = [re.findall(r'data-reason="(\w+)">\s*<td>(\d+)</td>', page) for page in pages]
    assert [int(p) for _, p in positions[0]] == list(range(1, PAGE_SIZE + 1))
    assert [int(p) for _, p in positions[1]] == list(range(PAGE_SIZE + 1, SMALL + LARGE + 1))
    assert f"Waiting trials ({SMALL + LARGE})" in pages[0]
    reasons = [reason for page in positions for reason, _ in page]
    left_out = SMALL + LARGE - MAX_REPLAY_TRIALS
    assert reasons[-left_out:] == ["later"] * left_out and "later" not in reasons[:-left_out]
    assert f"the other\n  {left_out} are left out of the estimate" in pages[0]
    for page in pages:
        assert "sweep" not in page.replace(mine.name, "")  # only alice's own experiment is named
    assert sum(page.count(f"{mine.name} #") for page in pages) == SMALL
