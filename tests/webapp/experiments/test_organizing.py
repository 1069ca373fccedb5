"""Organizing a team's experiments: tags and notes on experiments and trials, the experiment list's search,
filters and sort by best value, the trials table's sort, and saved comparisons of learning curves.

Everything is driven through the pages as a user would, on the real database; another team's experiments,
trials and comparisons are never shown, changed or added, and answer 404 like ones that do not exist.
"""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlencode

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.urls import reverse

from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.factories import draft, make_experiment
from tests.webapp.team_factories import join
from tests.webapp.test_lists_at_scale import LARGE, MOST_QUERIES, SMALL, add_experiments, add_trials, queries
from webapp.accounts.models import Team
from webapp.datasets.models import Dataset
from webapp.experiments import services
from webapp.experiments.annotations import MAX_TAGS, NOTES_MAX_CHARS, annotations_set
from webapp.ground.models import Experiment, SavedComparison, Trial
from webapp.paging import PAGE_SIZE

pytestmark = pytest.mark.django_db
NONE = "\N{EN DASH}"  # what a best-value cell shows without a value


def experiment(team: Team, dataset: Dataset, name: str, *, tags: list[str] | None = None,
               model: dict[str, Any] | None = None, trials: list[dict[str, Any]] | None = None) -> Experiment:
    """An experiment stored as the services store one, with `trials` (each a dict of Trial fields), created
    one after another so that the newest is the last made."""
    made = Experiment.objects.create(
        team=team, name=name, dataset=dataset, tags=tags or [],
        model=model or {"kind": "preset", "preset": "gpt2-micro"},
        search_space={"lr": {"kind": "categorical", "values": [1e-3]}}, strategy=Experiment.Strategy.GRID,
        n_trials=1, budget=10, eval_every=5)
    Trial.objects.bulk_create(Trial(experiment=made, number=n, params={"lr": 1e-3}, total_steps=10, **fields)
                              for n, fields in enumerate(trials or [], start=1))
    return made


def listed(client: Client, query: str = "") -> list[str]:
    """The names of the experiments the list's page shows, in order."""
    page = html.unescape(client.get(reverse("experiment_list") + query).content.decode())
    return re.findall(r'<a href="/experiments/\d+/">([^<]*)</a>', page)


# --- the experiment list: search, filters, sort -----------------------------------------------------------------


def test_the_list_searches_names_in_any_case_and_tags_exactly(alice_client, alice_team, bob_team) -> None:
    data = make_dataset(alice_team)
    experiment(alice_team, data, "LR sweep", tags=["baseline"])
    experiment(alice_team, data, "Wide model", tags=["wide", "baseline"])
    experiment(alice_team, data, "narrow model", tags=["wide net"])
    experiment(bob_team, make_dataset(bob_team), "bob sweep", tags=["baseline", "wide"])

    assert listed(alice_client, "?q=sweep") == ["LR sweep"]
    assert listed(alice_client, "?q=MODEL") == ["narrow model", "Wide model"]
    assert listed(alice_client, "?q=tag:baseline") == ["Wide model", "LR sweep"]
    assert listed(alice_client, "?q=tag:Baseline+wide") == ["Wide model"]  # a tag and a word of the name
    assert listed(alice_client, "?tag=wide") == ["Wide model"]  # not "wide net": tags match whole
    assert listed(alice_client, '?q=tag:"wide net"') == ["narrow model"]
    assert listed(alice_client, "?tag=wide&q=tag:baseline") == ["Wide model"]
    assert listed(alice_client, "?q=tag:nothing") == []
    page = alice_client.get(reverse("experiment_list") + "?q=tag:nothing").content.decode()
    assert "No experiments match." in page
    # the tag filter offers the team's own tags only, and each experiment's tags are chips linking to it
    page = alice_client.get(reverse("experiment_list")).content.decode()
    options = re.search(r'<select name="tag">(.*?)</select>', page, re.S).group(1)
    assert re.findall(r'<option value="([^"]+)"', options) == ["baseline", "wide", "wide net"]
    assert '<a class="chip" href="?tag=wide%20net">wide net</a>' in page


def test_the_list_filters_by_dataset_and_model(alice_client, alice_team, bob_team) -> None:
    web, books = make_dataset(alice_team, name="web"), make_dataset(alice_team, name="books")
    experiment(alice_team, web, "micro on web")
    experiment(alice_team, books, "micro on books")
    experiment(alice_team, web, "llama on web", model={"kind": "custom", "family": "llama", "n_layer": 2})
    experiment(alice_team, web, "gpt2 custom", model={"kind": "custom", "n_layer": 2})  # stored without family
    experiment(alice_team, books, "checkpoint on books",
               model={"kind": "checkpoint", "checkpoint": 7, "checkpoint_name": "tiny-llama"})
    bob_data = make_dataset(bob_team, name="bob web")
    experiment(bob_team, bob_data, "bob micro")

    assert set(listed(alice_client, f"?dataset={web.pk}")) == {"micro on web", "llama on web", "gpt2 custom"}
    assert listed(alice_client, f"?dataset={bob_data.pk}") == []  # another team's dataset names none of theirs
    assert set(listed(alice_client, "?model=preset:gpt2-micro")) == {"micro on web", "micro on books"}
    assert listed(alice_client, "?model=custom:llama") == ["llama on web"]
    assert listed(alice_client, "?model=custom:gpt2") == ["gpt2 custom"]
    assert listed(alice_client, "?model=checkpoint:tiny-llama") == ["checkpoint on books"]
    assert listed(alice_client, f"?model=preset:gpt2-micro&dataset={books.pk}") == ["micro on books"]
    page = html.unescape(alice_client.get(reverse("experiment_list")).content.decode())
    models = re.search(r'<select name="model">(.*?)</select>', page, re.S).group(1)
    assert re.findall(r'<option value="([^"]+)">([^<]+)</option>', models) == [
        ("checkpoint:tiny-llama", "Checkpoint tiny-llama"), ("custom:gpt2", "Custom GPT-2"),
        ("custom:llama", "Custom Llama"), ("preset:gpt2-micro", "GPT-2 micro")]
    datasets = re.search(r'<select name="dataset">(.*?)</select>', page, re.S).group(1)
    assert re.findall(r">([^<]+)</option>", datasets) == ["any", "books", "web"]


STATUS_CASES = {  # an experiment's trials' statuses -> the experiment's status
    "running": ["running", "finished", "runnable"],
    "queued": ["runnable", "new", "finished"],
    "paused": ["paused", "finished"],
    "draft": ["new", "new"],
    "finished": ["finished", "pruned"],
    "failed": ["failed", "finished", "cancelled"],
    "stopped": ["cancelled", "finished", "new"],
}


def test_the_list_filters_by_status_derived_from_the_trials(alice_client, alice_team) -> None:
    data = make_dataset(alice_team)
    for word, statuses in STATUS_CASES.items():
        experiment(alice_team, data, f"{word} one", trials=[{"status": s} for s in statuses])
    experiment(alice_team, data, "empty draft")  # no trials: nothing launched

    for word in STATUS_CASES:
        expected = [f"{word} one"] + (["empty draft"] if word == "draft" else [])
        assert sorted(listed(alice_client, f"?status={word}")) == sorted(expected), word
    assert len(listed(alice_client, "?status=bogus")) == len(STATUS_CASES) + 1  # an unknown status filters nothing
    page = alice_client.get(reverse("experiment_list")).content.decode()
    for word in STATUS_CASES:
        row = re.search(rf'<a href="/experiments/\d+/">{word} one</a>.*?data-field="status">(\w+)<', page, re.S)
        assert row.group(1).lower() == word


def test_the_list_sorts_by_best_value_bits_per_byte_first_and_missing_ones_last(alice_client, alice_team) -> None:
    data = make_dataset(alice_team)
    experiment(alice_team, data, "bpb 1.1", trials=[{"final_bpb": 1.1, "best_val_loss": 1.0}, {"final_bpb": 1.4}])
    experiment(alice_team, data, "nothing yet", trials=[{"status": "running"}])
    experiment(alice_team, data, "bpb 0.9", trials=[{"final_bpb": 0.9, "best_val_loss": 3.0}])
    experiment(alice_team, data, "loss 2.0", trials=[{"best_val_loss": 2.0}, {"best_val_loss": 2.5}])
    experiment(alice_team, data, "none")
    experiment(alice_team, data, "loss 1.5", trials=[{"best_val_loss": 1.5}])

    assert listed(alice_client, "?sort=best") == ["bpb 0.9", "bpb 1.1", "loss 1.5", "loss 2.0", "none",
                                                  "nothing yet"]
    assert listed(alice_client) == ["loss 1.5", "none", "loss 2.0", "bpb 0.9", "nothing yet", "bpb 1.1"]
    assert listed(alice_client, "?sort=name") == ["bpb 0.9", "bpb 1.1", "loss 1.5", "loss 2.0", "none",
                                                  "nothing yet"]
    page = html.unescape(alice_client.get(reverse("experiment_list") + "?sort=best").content.decode())
    best = [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r'data-field="best">(.*?)</td>', page, re.S)]
    assert best == ["0.9000 bpb", "1.1000 bpb", "1.5000 val loss", "2.0000 val loss", NONE, NONE]


def test_the_lists_pages_keep_the_search_and_filters(alice_client, alice_team) -> None:
    data = make_dataset(alice_team)
    tagged = add_experiments(alice_team, data, count=PAGE_SIZE + 10, trials_each=1)
    Experiment.objects.filter(pk__in=[e.pk for e in tagged]).update(tags=["big"])
    add_experiments(alice_team, data, count=5, trials_each=1)
    url = reverse("experiment_list") + "?tag=big&sort=name"
    first = alice_client.get(url).content.decode()
    assert 'href="?tag=big&amp;sort=name&amp;page=2" rel="next"' in first
    assert f"1\N{EN DASH}{PAGE_SIZE} of {PAGE_SIZE + 10}" in first
    second = listed(alice_client, "?tag=big&sort=name&page=2")
    names = sorted((e.name for e in tagged), key=str.lower)
    assert listed(alice_client, "?tag=big&sort=name") + second == names


def test_the_list_reads_the_same_queries_with_every_filter_on_at_any_size(alice_client, alice_team) -> None:
    data = make_dataset(alice_team)
    url = (reverse("experiment_list")
           + f"?q=sweep+tag:big&dataset={data.pk}&model=preset:tiny&status=running&sort=best")

    def grow(count: int) -> None:
        made = add_experiments(alice_team, data, count=count, trials_each=3)  # each has a running trial
        Experiment.objects.filter(pk__in=[e.pk for e in made]).update(tags=["big", "sweep"])

    grow(SMALL)
    small = queries(alice_client, url)
    assert len(listed(alice_client, url[len(reverse("experiment_list")):])) == SMALL
    grow(LARGE - SMALL)
    assert queries(alice_client, url) == small <= MOST_QUERIES
    assert queries(alice_client, url + "&page=2") == small
    assert queries(alice_client, reverse("experiment_list")) <= small


# --- an experiment's trials table ----------------------------------------------------------------------------


def trial_numbers(client: Client, experiment: Experiment, query: str = "") -> list[int]:
    numbers = {t.pk: t.number for t in experiment.trials.all()}
    page = client.get(reverse("experiment_detail", args=[experiment.pk]) + query).content.decode()
    return [numbers[int(pk)] for pk in re.findall(r'<tr data-trial="(\d+)"', page)]


def test_the_trials_table_sorts_by_best_value_and_status_and_shows_tags(alice_client, alice_team) -> None:
    made = experiment(alice_team, make_dataset(alice_team), "sweep", trials=[
        {"status": "finished", "best_val_loss": 2.0},
        {"status": "failed"},
        {"status": "finished", "final_bpb": 1.2, "best_val_loss": 3.0, "tags": ["keeper"]},
        {"status": "running", "best_val_loss": 1.0},
        {"status": "pruned", "final_bpb": 1.1},
    ])
    assert trial_numbers(alice_client, made) == [1, 2, 3, 4, 5]
    assert trial_numbers(alice_client, made, "?sort=best") == [5, 3, 4, 1, 2]
    assert trial_numbers(alice_client, made, "?sort=status") == [4, 1, 3, 5, 2]
    page = html.unescape(alice_client.get(reverse("experiment_detail", args=[made.pk]) + "?sort=best").content
                         .decode())
    best = [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r'data-field="best">(.*?)</td>', page, re.S)]
    assert best == ["1.1000 bpb", "1.2000 bpb", "1.0000 val loss", "2.0000 val loss", NONE]
    assert '<span class="chip">keeper</span>' in page


def test_the_trials_pages_keep_the_sort(alice_client, alice_team) -> None:
    [made] = add_experiments(alice_team, make_dataset(alice_team), count=1, trials_each=LARGE)
    url = reverse("experiment_detail", args=[made.pk])
    first = alice_client.get(url + "?sort=best").content.decode()
    assert 'href="?sort=best&amp;page=2#trials" rel="next"' in first
    # the fixture's trials score 2 + 1/number: the best are the last numbered
    assert trial_numbers(alice_client, made, "?sort=best") == list(range(LARGE, LARGE - PAGE_SIZE, -1))
    assert trial_numbers(alice_client, made, "?sort=best&page=2") == list(range(LARGE - PAGE_SIZE, 0, -1))
    small = queries(alice_client, url + "?sort=status")
    add_trials([made], trials_each=10, first=LARGE + 1)
    assert queries(alice_client, url + "?sort=status&page=2") == small <= MOST_QUERIES


# --- tags and notes --------------------------------------------------------------------------------------------


@pytest.fixture
def sweep(alice_team, alice_dataset) -> Experiment:
    return make_experiment(alice_team, alice_dataset, name="sweep")


def post_annotations(client: Client, obj: Experiment | Trial, tags: str, notes: str = "") -> Any:
    name = "experiment_annotations" if isinstance(obj, Experiment) else "trial_annotations"
    return client.post(reverse(name, args=[obj.pk]), {"tags": tags, "notes": notes})


def test_an_owner_tags_and_notes_an_experiment_and_a_trial(alice_client, sweep) -> None:
    response = post_annotations(alice_client, sweep, " Baseline, lr  sweep,baseline , a.b_c-d, Ünïcode 2,",
                                "Why: the lr range.\r\nNext: wider.")
    assert response.status_code == 302
    assert response["Location"] == reverse("experiment_detail", args=[sweep.pk]) + "#notes"
    sweep.refresh_from_db()
    assert sweep.tags == ["baseline", "lr sweep", "a.b_c-d", "ünïcode 2"]
    assert sweep.notes == "Why: the lr range.\nNext: wider."
    page = alice_client.get(reverse("experiment_detail", args=[sweep.pk])).content.decode()
    assert '<span class="chip">lr sweep</span>' in page and "Why: the lr range.\nNext: wider." in page
    assert listed(alice_client, "?" + urlencode({"q": 'tag:"Ünïcode 2"'})) == ["sweep"]

    trial = sweep.trials.get(number=2)
    assert post_annotations(alice_client, trial, "keeper", "best so far").status_code == 302
    trial.refresh_from_db()
    assert (trial.tags, trial.notes) == (["keeper"], "best so far")
    page = alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    assert '<span class="chip">keeper</span>' in page and "best so far" in page
    assert post_annotations(alice_client, trial, "", "").status_code == 302  # cleared
    trial.refresh_from_db()
    assert (trial.tags, trial.notes) == ([], "")


@pytest.mark.parametrize(("tags", "notes", "error"), [
    (", ".join(f"t{n}" for n in range(MAX_TAGS + 1)), "", f"At most {MAX_TAGS} tags"),
    ("fine, not/ok", "", "use letters, digits"),
    ("fine, emoji \N{ROCKET}", "", "use letters, digits"),
    ("x" * 33, "", "longer than 32 characters"),
    ("fine", "n" * (NOTES_MAX_CHARS + 1), "at most 10000 characters"),
])
def test_bad_tags_or_notes_too_long_are_refused_saying_why_and_change_nothing(alice_client, sweep, tags, notes,
                                                                              error) -> None:
    for obj in (sweep, sweep.trials.first()):
        response = post_annotations(alice_client, obj, tags, notes)
        assert response.status_code == 400
        assert error in html.unescape(response.content.decode())
        assert tags in html.unescape(response.content.decode())  # what was typed is kept to correct it
        obj.refresh_from_db()
        assert (obj.tags, obj.notes) == ([], "")


def test_sixteen_tags_of_32_characters_and_10000_characters_of_notes_are_kept(alice_client, sweep) -> None:
    tags = [f"{n:02d}" + "x" * 30 for n in range(MAX_TAGS)]
    assert post_annotations(alice_client, sweep, ",".join(tags), "n" * NOTES_MAX_CHARS).status_code == 302
    sweep.refresh_from_db()
    assert sweep.tags == tags and len(sweep.notes) == NOTES_MAX_CHARS


def test_only_the_creator_and_the_teams_owners_change_tags_and_notes(alice, alice_team, alice_dataset,
                                                                     django_user_model, sweep) -> None:
    member = django_user_model.objects.create(username="dora")
    join(alice_team, alice, member)
    client = Client()
    client.force_login(member)
    trial = sweep.trials.first()
    for obj in (sweep, trial):  # created by someone else: refused, page and service alike
        assert post_annotations(client, obj, "mine", "mine").status_code == 403
        obj.refresh_from_db()
        assert (obj.tags, obj.notes) == ([], "")
        with pytest.raises(PermissionDenied):
            annotations_set(obj=obj, actor=member, tags=["mine"], notes="")
    page = client.get(reverse("experiment_detail", args=[sweep.pk])).content.decode()
    assert "Edit tags and notes" not in page
    own = services.experiment_create(team=alice_team, user=member, draft=draft(alice_dataset, name="dora's"))
    assert post_annotations(client, own, "mine").status_code == 302
    assert post_annotations(client, own.trials.first(), "mine too").status_code == 302
    own.refresh_from_db()
    assert own.tags == ["mine"] and own.trials.first().tags == ["mine too"]


def test_another_teams_experiment_and_trial_answer_404(bob_client, sweep) -> None:
    trial = sweep.trials.first()
    for obj in (sweep, trial):
        assert post_annotations(bob_client, obj, "theirs", "theirs").status_code == 404
        url = reverse("experiment_annotations" if obj is sweep else "trial_annotations", args=[obj.pk])
        assert bob_client.get(url).status_code == 404
        obj.refresh_from_db()
        assert (obj.tags, obj.notes) == ([], "")


# --- saved comparisons -----------------------------------------------------------------------------------------


@pytest.fixture
def pair(alice_team, alice_dataset) -> tuple[Experiment, Experiment]:
    return (experiment(alice_team, alice_dataset, "lr sweep", trials=[{"status": "finished"}]),
            experiment(alice_team, alice_dataset, "wd sweep", trials=[{"status": "finished"}]))


def save(client: Client, name: str, experiments: list[Experiment], **view: str) -> Any:
    return client.post(reverse("comparison_create"),
                       {"name": name, "experiments": [e.pk for e in experiments], **view})


def test_a_comparison_is_saved_from_the_curves_page_and_opens_it_again(alice_client, pair) -> None:
    first, second = pair
    curves = reverse("dashboard_curves", args=[first.pk])
    page = alice_client.get(curves + f"?compare={second.pk}&x=tokens").content.decode()
    form = re.search(r'<form method="post" action="/comparisons/new/".*?</form>', page, re.S).group(0)
    assert sorted(re.findall(r'name="experiments" value="(\d+)"', form)) == sorted([str(first.pk), str(second.pk)])
    assert 'name="x" value="tokens"' in form

    response = save(alice_client, "  lr vs  wd ", [first, second], x="tokens", metric="loss", smooth="0.6")
    opened = f"{curves}?compare={second.pk}&metric=loss&smooth=0.6&x=tokens"
    assert response.status_code == 302 and response["Location"] == opened
    comparison = SavedComparison.objects.get()
    assert comparison.name == "lr vs wd" and set(comparison.experiments.all()) == {first, second}

    listing = alice_client.get(reverse("experiment_list")).content.decode()
    assert f'<a href="/comparisons/{comparison.pk}/">lr vs wd</a>' in listing
    assert alice_client.get(reverse("comparison_list")).content.decode().count("lr vs wd") == 1
    response = alice_client.get(reverse("comparison_open", args=[comparison.pk]))
    assert response.status_code == 302 and response["Location"] == opened
    shown = alice_client.get(opened).content.decode()
    assert re.search(rf'value="{second.pk}" checked', shown)


def test_a_comparison_name_is_unique_in_its_team_only(alice_client, bob_client, bob_team, pair) -> None:
    assert save(alice_client, "mine", list(pair)).status_code == 302
    response = save(alice_client, "mine", [pair[0]])
    assert response.status_code == 302
    page = alice_client.get(response["Location"]).content.decode()
    assert "already has a comparison named" in html.unescape(page)
    assert save(alice_client, "  ", [pair[0]]).status_code == 302
    assert save(alice_client, "x" * 121, [pair[0]]).status_code == 302
    assert SavedComparison.objects.count() == 1
    theirs = experiment(bob_team, make_dataset(bob_team), "bob sweep")
    assert save(bob_client, "mine", [theirs]).status_code == 302
    assert SavedComparison.objects.filter(team=bob_team, name="mine").exists()


def test_another_teams_experiments_are_never_added(alice_client, bob_team, pair) -> None:
    theirs = experiment(bob_team, make_dataset(bob_team), "bob sweep")
    for experiments in ([pair[0], theirs], [theirs]):
        response = save(alice_client, "sneaky", experiments, x="tokens")
        page = html.unescape(alice_client.get(response["Location"]).content.decode())
        assert "Only your team's experiments can be compared." in page and "bob sweep" not in page
        assert not SavedComparison.objects.exists()
    assert response["Location"] == reverse("experiment_list")  # none of theirs to go back to


def test_another_teams_comparison_answers_404(alice_client, bob_client, pair) -> None:
    save(alice_client, "private", list(pair))
    comparison = SavedComparison.objects.get()
    assert bob_client.get(reverse("comparison_open", args=[comparison.pk])).status_code == 404
    assert bob_client.post(reverse("comparison_delete", args=[comparison.pk])).status_code == 404
    assert "private" not in bob_client.get(reverse("comparison_list")).content.decode()
    assert "private" not in bob_client.get(reverse("experiment_list")).content.decode()
    assert SavedComparison.objects.filter(pk=comparison.pk).exists()


def test_a_comparison_opens_with_the_experiments_left_after_one_is_deleted(alice, alice_client, alice_dataset,
                                                                          alice_team, pair) -> None:
    first, second = pair
    third = experiment(alice_team, alice_dataset, "batch sweep")
    save(alice_client, "three", [first, second, third])
    comparison = SavedComparison.objects.get()
    services.experiment_delete(experiment=first, actor=alice)
    response = alice_client.get(reverse("comparison_open", args=[comparison.pk]))
    assert response["Location"] == reverse("dashboard_curves", args=[second.pk]) + f"?compare={third.pk}"
    assert alice_client.get(response["Location"]).status_code == 200
    for left in (second, third):
        services.experiment_delete(experiment=left, actor=alice)
    response = alice_client.get(reverse("comparison_open", args=[comparison.pk]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("comparison_list")
    assert "Every experiment of comparison" in html.unescape(response.content.decode())


def test_a_comparison_is_deleted_by_its_creator_or_an_owner_only(alice, alice_client, alice_team,
                                                                django_user_model, pair) -> None:
    member, other = (django_user_model.objects.create(username=n) for n in ("dora", "eve"))
    join(alice_team, alice, member)
    join(alice_team, alice, other)
    clients = {}
    for user in (member, other):
        clients[user.username] = Client()
        clients[user.username].force_login(user)
    save(clients["dora"], "dora's", list(pair))
    save(clients["dora"], "dora's second", list(pair))
    comparison, second = SavedComparison.objects.order_by("pk")
    assert clients["eve"].post(reverse("comparison_delete", args=[comparison.pk])).status_code == 403
    assert "Delete</button>" not in clients["eve"].get(reverse("comparison_list")).content.decode()
    assert clients["dora"].post(reverse("comparison_delete", args=[comparison.pk])).status_code == 302
    assert alice_client.post(reverse("comparison_delete", args=[second.pk])).status_code == 302
    assert not SavedComparison.objects.exists()
    assert Experiment.objects.filter(pk__in=[e.pk for e in pair]).count() == 2  # its experiments stay
