"""The ``hydra`` command line against a real server: its config, its output and its exit codes, which scripts
rely on (see `hydra_client.cli`)."""

from __future__ import annotations

import json
import os
import stat
import tarfile
import time
from pathlib import Path

import pytest

from tests.browser.devstack import free_port
from tests.client.conftest import Shell, make_token
from tests.webapp.catalog.checkpoints import tiny_llama
from tests.webapp.conftest import web_worker  # noqa: F401 -- a fixture
from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_archives import lora_export
from tests.webapp.experiments.test_generations import finished
from webapp.ground.models import Trial
from webapp.telemetry.models import EvalMetric, StepMetric

SPACE = "model: {preset: gpt2-micro}\nlr: {kind: categorical, values: [0.001, 0.003]}\nbatch_size: [2]\n"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _document(result) -> object:
    """The one JSON document a ``--json`` command printed on stdout."""
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_login_checks_the_token_and_saves_it_for_the_owner_only(hydra: Shell, server, alice, alice_token) -> None:
    result = hydra("login", f"{server}/", input=f"{alice_token}\n")
    assert result.exit_code == 0, result.output
    assert f"Logged in to {server} as alice in team Alice lab" in result.stdout
    assert alice_token not in result.output
    assert json.loads(hydra.config.read_text()) == {"url": server, "token": alice_token, "team": ""}
    assert _mode(hydra.config) == 0o600
    assert _mode(hydra.config.parent) == 0o700
    whoami = _document(hydra("whoami", "--json"))
    assert (whoami["username"], whoami["team"]["name"], whoami["scope"]) == ("alice", "Alice lab", "write")


def test_login_narrows_a_config_file_others_could_read(hydra: Shell, server, alice, alice_token) -> None:
    hydra.config.parent.mkdir(parents=True)
    hydra.config.write_text("{}")
    os.chmod(hydra.config, 0o644)
    assert hydra("login", server, "--token", alice_token).exit_code == 0
    assert _mode(hydra.config) == 0o600


@pytest.mark.parametrize("url", ["http://hydra.lab.example", "http://10.1.2.3:8000", "http://[2001:db8::1]/"])
def test_login_refuses_to_send_a_token_in_clear_to_another_machine(hydra: Shell, url: str) -> None:
    result = hydra("login", url, "--token", "hyd_secret-token")
    assert result.exit_code == 2
    assert "plain HTTP to another machine: the token would cross the network in clear" in result.stderr
    assert "refusing to send the token in clear; give an https:// URL, or --insecure" in result.stderr
    assert "hyd_secret-token" not in result.output
    assert not hydra.config.exists()


def test_login_with_insecure_warns_and_goes_on(hydra: Shell) -> None:
    result = hydra("login", "http://hydra.invalid:8000", "--token", "hyd_secret-token", "--insecure")
    assert "the token would cross the network in clear" in result.stderr
    assert result.exit_code == 5  # it tried: .invalid never resolves
    assert "refusing" not in result.stderr and not hydra.config.exists()


def test_login_over_http_to_this_machine_needs_no_flag(hydra: Shell, server, alice, alice_token) -> None:
    assert server.startswith("http://127.0.0.1") or server.startswith("http://localhost")
    result = hydra("login", server, "--token", alice_token)
    assert result.exit_code == 0 and "in clear" not in result.stderr


def test_a_bad_token_exits_3_and_is_not_saved(hydra: Shell, server, alice) -> None:
    result = hydra("login", server, "--token", "hyd_not-a-token")
    assert result.exit_code == 3
    assert "Send a live personal access token" in result.stderr
    assert "Traceback" not in result.output
    assert not hydra.config.exists()


def test_the_environment_overrides_the_saved_login(alice_hydra: Shell, server, bob) -> None:
    assert alice_hydra("whoami", HYDRA_TOKEN="hyd_revoked-or-typo").exit_code == 3
    bobs = _document(alice_hydra("whoami", "--json", HYDRA_TOKEN=make_token(bob)))
    assert bobs["username"] == "bob"
    nothing_saved = Shell(config=alice_hydra.config.with_name("none.json"))
    assert nothing_saved("whoami").exit_code == 3
    assert "Not logged in" in nothing_saved("whoami").stderr
    from_env = nothing_saved("whoami", "--json", HYDRA_URL=server, HYDRA_TOKEN=make_token(bob))
    assert _document(from_env)["username"] == "bob"


def test_a_read_only_token_may_not_write(hydra: Shell, server, alice) -> None:
    hydra("login", server, "--token", make_token(alice, scope="read"))
    assert hydra("datasets", "list").exit_code == 0
    result = hydra("datasets", "sample")
    assert result.exit_code == 3
    assert "This token may only read" in result.stderr


def test_another_teams_objects_exit_4(alice_hydra: Shell, bob_team, db_lock) -> None:
    with db_lock:
        experiment = make_experiment(bob_team, make_dataset(bob_team))
        trial = experiment.trials.first()
    for args in (["experiments", "show", str(experiment.pk)], ["experiments", "launch", str(experiment.pk)],
                 ["trials", "cancel", str(trial.pk)], ["leaderboard", str(experiment.dataset_id)]):
        result = alice_hydra(*args)
        assert result.exit_code == 4, (args, result.output)
        assert result.stderr.startswith("Error: No such "), result.stderr
    assert alice_hydra("--team", str(bob_team.pk), "whoami").exit_code == 4
    assert Trial.objects.get(pk=trial.pk).status == Trial.Status.NEW


def test_every_read_prints_one_json_document(alice_hydra: Shell, alice_team, db_lock) -> None:
    with db_lock:
        dataset = make_dataset(alice_team, name="tiny")
        experiment = make_experiment(alice_team, dataset, name="sweep")
    assert [d["name"] for d in _document(alice_hydra("datasets", "list", "--json"))] == ["tiny"]
    assert [d["name"] for d in _document(alice_hydra("--json", "datasets", "list"))] == ["tiny"]
    assert _document(alice_hydra("datasets", "show", str(dataset.pk), "--json"))["status"] == "ready"
    assert [e["name"] for e in _document(alice_hydra("experiments", "list", "--json"))] == ["sweep"]
    shown = _document(alice_hydra("experiments", "show", str(experiment.pk), "--json"))
    assert [t["status"] for t in shown["trial_list"]] == ["new", "new"]
    assert _document(alice_hydra("experiments", "space", str(experiment.pk), "--json"))["lr"]["values"] == [0.001,
                                                                                                              0.003]
    assert _document(alice_hydra("models", "list", "--json")) == []
    assert _document(alice_hydra("leaderboard", str(dataset.pk), "--json"))["team"] == []
    assert _document(alice_hydra("queue", "--json"))["waiting"] == []
    text = alice_hydra("experiments", "show", str(experiment.pk))
    assert "Experiment" in text.stdout and "2 trial(s)" in text.stdout and "lr=0.001" in text.stdout


def test_a_bad_search_space_prints_the_forms_message_and_exits_1(alice_hydra: Shell, alice_team, db_lock,
                                                                  tmp_path: Path) -> None:
    with db_lock:
        dataset = make_dataset(alice_team)
    space = tmp_path / "space.yaml"
    space.write_text("lr: {kind: categorical, values: []}\n")
    result = alice_hydra("experiments", "create", str(space), "--name", "empty", "--dataset", str(dataset.pk))
    assert result.exit_code == 1
    assert "space: lr: list at least one value." in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.output


def test_a_space_with_several_mistakes_prints_each_and_exits_1(alice_hydra: Shell, alice_team, db_lock,
                                                               tmp_path: Path) -> None:
    with db_lock:
        dataset = make_dataset(alice_team)
    space = tmp_path / "space.yaml"
    space.write_text("lora_rank: [8]\nlr: 0.001\noptimizer: adam\n")
    result = alice_hydra("experiments", "create", str(space), "--name", "typos", "--dataset", str(dataset.pk))
    assert result.exit_code == 1
    assert "space: Unknown parameter 'lora_rank'; did you mean lora_r?" in result.stderr
    assert "space: optimizer: 'adam' is not one of adamw, sgd." in result.stderr
    space.write_text("lr: [0.1\nbatch_size: 8\n")
    result = alice_hydra("experiments", "create", str(space), "--name", "broken", "--dataset", str(dataset.pk))
    assert result.exit_code == 1
    assert ("space: The pasted text is neither YAML nor JSON: line 2, column 11: expected ',' or ']', but got ':' "
            "(in the [ list that opens at line 1, column 5).") in result.stderr


def test_a_budget_over_the_cap_prints_the_forms_one_message(alice_hydra: Shell, alice_team, db_lock, settings,
                                                              tmp_path: Path) -> None:
    with db_lock:
        dataset = make_dataset(alice_team)
    space = tmp_path / "space.yaml"
    space.write_text("lr: 0.001\n")
    result = alice_hydra("experiments", "create", str(space), "--name", "long", "--dataset", str(dataset.pk),
                         "--budget", "100000000")
    assert result.exit_code == 1
    cap = settings.HYDRA.caps.steps_per_trial
    assert (f"budget: A trial would take 100,000,000 optimizer steps; the cap is {cap:,} per trial "
            "(HYDRA_MAX_STEPS_PER_TRIAL)") in result.stderr
    assert "less than or equal" not in result.stderr


def test_a_sample_dataset_is_made_and_tokenized_in_the_background(alice_hydra: Shell) -> None:
    made = _document(alice_hydra("datasets", "sample", "--json"))
    assert (made["name"], made["source"], made["kind"], made["status"]) == (
        "Python reference (sample)", "sample", "corpus", "tokenizing")
    chat = _document(alice_hydra("datasets", "sample", "--chat", "--name", "chat", "--vocab-size", "512", "--json"))
    assert (chat["name"], chat["kind"], chat["vocab_size"]) == ("chat", "messages", 512)
    listed = alice_hydra("datasets", "list")
    assert "Python reference (sample)" in listed.stdout and "tokenizing" in listed.stdout
    again = alice_hydra("datasets", "sample", "--chat", "--name", "chat")
    assert again.exit_code == 1
    assert "name: Your team already has a dataset named 'chat'." in again.stderr


def test_an_upload_is_checked_as_the_page_checks_it(alice_hydra: Shell, tmp_path: Path) -> None:
    corpus = tmp_path / "notes.txt"
    corpus.write_text("Heads take turns on the device.\n" * 50)
    made = _document(alice_hydra("datasets", "upload", str(corpus), "--vocab-size", "300", "--json"))
    assert (made["name"], made["source"], made["n_bytes"]) == ("notes.txt", "upload", corpus.stat().st_size)
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\x01" * 10)
    refused = alice_hydra("datasets", "upload", str(binary))
    assert refused.exit_code == 1
    assert "file: The file looks binary" in refused.stderr


def test_an_upload_maps_columns_to_roles(alice_hydra: Shell, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("title,body,notes\n" + "".join(f"Q{k},A{k},n\n" for k in range(8)))
    made = _document(alice_hydra("datasets", "upload", str(pairs), "--column", "prompt=title", "--column",
                                 "completion=body", "--json"))
    assert (made["kind"], made["columns"]) == ("prompt_completion", {"prompt": "title", "completion": "body"})
    unknown = alice_hydra("datasets", "upload", str(pairs), "--name", "again", "--column", "prompt=heading")
    assert unknown.exit_code == 1
    assert "columns: pairs.csv: no column 'heading' in the file; found 'title', 'body', 'notes'" in unknown.stderr
    assert alice_hydra("datasets", "upload", str(pairs), "--column", "prompt").exit_code == 2


def test_usage_errors_exit_2(alice_hydra: Shell, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    assert alice_hydra("experiments", "create", str(space), "--dataset", "1").exit_code == 2  # no --name
    assert alice_hydra("experiments", "create", str(tmp_path / "missing.yaml"), "--name", "x",
                       "--dataset", "1").exit_code == 2
    assert alice_hydra("experiments", "clone", "1", "--set", "colour=blue").exit_code == 2
    assert alice_hydra("watch").exit_code == 2


def test_a_server_out_of_reach_exits_5(hydra: Shell) -> None:
    result = hydra("whoami", HYDRA_URL=f"http://127.0.0.1:{free_port()}", HYDRA_TOKEN="hyd_x")
    assert result.exit_code == 5
    assert "cannot be reached: Connection refused" in result.stderr


def test_the_help_documents_the_exit_codes(hydra: Shell) -> None:
    result = hydra("--help")
    assert result.exit_code == 0
    for line in ("0  done", "2  usage error", "3  not authenticated or not allowed", "4  not found",
                 "5  server unreachable"):
        assert line in result.stdout


def test_an_experiment_is_created_launched_cloned_and_cancelled(alice_hydra: Shell, alice_team, db_lock,
                                                                 tmp_path: Path) -> None:
    with db_lock:
        dataset = make_dataset(alice_team)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    made = _document(alice_hydra("experiments", "create", str(space), "--name", "lr sweep", "--dataset",
                                 str(dataset.pk), "--budget", "30", "--eval-every", "10", "--memory-mib", "256",
                                 "--launch", "--json"))
    assert (made["name"], made["budget"], made["eval_every"], made["trials"]["active"]) == ("lr sweep", 30, 10, 2)
    copy = _document(alice_hydra("experiments", "clone", str(made["id"]), "--set", "name=lr sweep, longer",
                                 "--set", "budget=60", "--json"))
    assert (copy["name"], copy["budget"], copy["cloned_from"], copy["trials"]["new"]) == (
        "lr sweep, longer", 60, made["id"], 2)
    cancelled = alice_hydra("experiments", "cancel", str(made["id"]))
    assert cancelled.exit_code == 0
    assert cancelled.stdout.strip() == "2 trial(s) asked to stop."


def test_watch_ends_with_the_trials_results(alice_hydra: Shell, alice_team, db_lock) -> None:
    """Exit 0 when every trial finished or was pruned, with each one's validation bits per byte (what the
    leaderboard ranks by), best validation loss and last training loss, each named."""
    with db_lock:
        experiment = make_experiment(alice_team, make_dataset(alice_team))
        first, second = experiment.trials.order_by("number")
        Trial.objects.filter(pk=first.pk).update(status="finished", attempt=1, step=10, final_bpb=2.5,
                                                 final_loss=2.8, best_val_loss=2.7)
        Trial.objects.filter(pk=second.pk).update(status="pruned", attempt=1, step=5)
        for step, loss in ((4, 3.5), (9, 2.75)):
            StepMetric.objects.create(trial=first, attempt=1, step=step, loss=loss, lr=1e-3, tokens=64, time=0.0)
        EvalMetric.objects.create(trial=second, attempt=1, step=5, loss=3.0, perplexity=20.0, bpb=3.25, time=0.0)
    watched = _document(alice_hydra("watch", str(experiment.pk), "--interval", "0.1", "--json"))
    assert watched["ok"] is True
    rows = {row["number"]: row for row in watched["trials"]}
    assert (rows[1]["status"], rows[1]["val_bpb"], rows[1]["best_val_loss"], rows[1]["train_loss"]) == (
        "finished", 2.5, 2.7, 2.75)
    assert (rows[2]["status"], rows[2]["val_bpb"], rows[2]["train_loss"]) == ("pruned", 3.25, None)
    text = alice_hydra("watch", str(experiment.pk))
    assert text.exit_code == 0
    # batch_size is 2 in both: the label names what tells the trials apart
    assert "#1 lr=0.001: finished, val bpb 2.5, best val loss 2.7, train loss 2.75" in text.stderr
    assert "#2 lr=0.003: pruned, val bpb 3.25 (latest eval)" in text.stderr
    assert "VAL BPB" in text.stdout and "BEST VAL LOSS" in text.stdout and "TRAIN LOSS" in text.stdout


def test_watch_exits_1_when_a_trial_failed_or_was_cancelled(alice_hydra: Shell, alice_team, db_lock) -> None:
    with db_lock:
        experiment = make_experiment(alice_team, make_dataset(alice_team))
        first, second = experiment.trials.order_by("number")
        Trial.objects.filter(pk=first.pk).update(status="finished", attempt=1, step=10, final_loss=2.8)
        Trial.objects.filter(pk=second.pk).update(status="failed", attempt=1, message="out of memory")
    result = alice_hydra("watch", str(experiment.pk), "--interval", "0.1", "--json")
    assert result.exit_code == 1
    watched = json.loads(result.stdout)
    assert watched["ok"] is False
    assert [(r["status"], r["message"]) for r in watched["trials"]] == [("finished", ""), ("failed", "out of memory")]
    assert "failed, out of memory" in result.stderr


def test_watch_of_trials_never_launched_says_so_at_once(alice_hydra: Shell, alice_team, db_lock) -> None:
    with db_lock:
        experiment = make_experiment(alice_team, make_dataset(alice_team))
    started = time.monotonic()
    result = alice_hydra("watch", str(experiment.pk), "--interval", "5")
    assert result.exit_code == 1
    assert f"2 trial(s) of experiment {experiment.pk} are not launched" in result.stderr
    assert time.monotonic() - started < 5


def test_a_dataset_is_named_by_its_id_or_its_name(alice_hydra: Shell, alice_team, bob_team, db_lock) -> None:
    with db_lock:
        chat = make_dataset(alice_team, name="chat-jsonl")
        make_dataset(alice_team, name="Twice")
        make_dataset(alice_team, name="TWICE")
        make_dataset(bob_team, name="bobs")
    for args in (("leaderboard", "chat-jsonl"), ("datasets", "show", "Chat-JSONL"), ("leaderboard", str(chat.pk))):
        result = alice_hydra(*args, "--json")
        assert result.exit_code == 0, (args, result.output)
        assert json.loads(result.stdout)["dataset" if args[0] == "leaderboard" else "id"] == chat.pk
    twice = alice_hydra("leaderboard", "twice")
    assert twice.exit_code == 1 and "2 datasets of the team are named 'twice' (ids " in twice.stderr
    assert alice_hydra("datasets", "show", "Twice").exit_code == 0  # the exact name picks one
    for name in ("nothing-so-named", "bobs"):  # another team's name is as unknown as none
        unknown = alice_hydra("leaderboard", name)
        assert unknown.exit_code == 4 and f"The team has no dataset named {name!r}" in unknown.stderr


def test_download_takes_a_lora_trials_adapter_alone_named_by_the_trials_number_and_id(
        alice_hydra: Shell, alice_team, db_lock, web_worker, settings, tmp_path: Path) -> None:  # noqa: F811
    with db_lock:
        plain, lora = make_experiment(alice_team, make_dataset(alice_team), name="lora sweep").trials.order_by("number")
        settings.HYDRA.models_root.mkdir(parents=True, exist_ok=True)
        lora_export(lora, tiny_llama(settings.HYDRA.models_root / "tiny-llama"))
        finished(plain)
        Path(plain.export_path).mkdir(parents=True)
        (Path(plain.export_path) / "config.json").write_text("{}")
    result = alice_hydra("download", str(lora.pk), "--adapter", "-o", str(tmp_path / "out"), "--json")
    got = _document(result)
    assert (got["number"], got["kind"]) == (2, "adapter")  # trial id lora.pk is #2 of its experiment
    assert Path(got["path"]) == tmp_path / "out" / f"lora_sweep-trial-2-id-{lora.pk}-adapter.tar.gz"
    assert f"Trial {lora.pk} (#2 of experiment {lora.experiment_id}): adapter, about " in result.stderr
    assert "; also: merged model " in result.stderr and "(without --adapter)" in result.stderr
    with tarfile.open(got["path"]) as tar:
        names = {Path(name).name for name in tar.getnames()}
    assert "adapter_model.safetensors" in names and "model.safetensors" not in names
    refused = alice_hydra("download", str(plain.pk), "--adapter")
    assert refused.exit_code == 2 and "This trial trained no LoRA adapter" in refused.stderr


def test_trial_controls_answer_with_the_trial_or_say_why_not(alice_hydra: Shell, alice_team, db_lock) -> None:
    with db_lock:
        experiment = make_experiment(alice_team, make_dataset(alice_team))
        trial = experiment.trials.order_by("number").first()
    refused = alice_hydra("trials", "pause", str(trial.pk))
    assert refused.exit_code == 1
    assert refused.stderr.strip() == "Error: Trial #1 is not launched; it cannot pause."
    cancelled = _document(alice_hydra("trials", "cancel", str(trial.pk), "--json"))
    assert (cancelled["id"], cancelled["status"], cancelled["actions"]) == (trial.pk, "cancelled", ["retry"])
    not_finished = alice_hydra("trials", "continue", str(trial.pk), "--steps", "10", "--lr", "0.001")
    assert not_finished.exit_code == 1
    assert "Only a finished or pruned trial can be continued." in not_finished.stderr


@pytest.mark.parametrize("steps", ["0", "-5"])
def test_continue_takes_the_pages_rules(alice_hydra: Shell, alice_team, db_lock, steps: str) -> None:
    with db_lock:
        experiment = make_experiment(alice_team, make_dataset(alice_team))
        trial = experiment.trials.first()
        Trial.objects.filter(pk=trial.pk).update(status="finished", attempt=1, step=10)
    result = alice_hydra("trials", "continue", str(trial.pk), "--steps", steps, "--lr", "0.001")
    assert result.exit_code == 1
    assert "steps: Ensure this value is greater than or equal to 1." in result.stderr


def test_every_read_prints_text_for_people(alice_hydra: Shell, alice_team, db_lock) -> None:
    with db_lock:
        dataset = make_dataset(alice_team, name="tiny")
        experiment = make_experiment(alice_team, dataset, name="sweep")
        trial = experiment.trials.order_by("number").first()
        Trial.objects.filter(pk=trial.pk).update(status="finished", attempt=1, step=10, final_bpb=2.5,
                                                 final_loss=2.8, final_ppl=16.4, final_step=10)
    expected = {
        ("whoami",): "alice at ",
        ("datasets", "list"): "tiny",
        ("datasets", "show", str(dataset.pk)): f"Dataset {dataset.pk} 'tiny': ready",
        ("experiments", "list"): "sweep",
        ("experiments", "show", str(experiment.pk)): "1 finished",
        ("trials", "show", str(trial.pk)): f"Trial {trial.pk} (#1 of experiment {experiment.pk}): finished",
        ("leaderboard", str(dataset.pk)): "2.5",
        ("queue",): "nothing waits",
        ("models", "list"): "NAME",
    }
    for args, text in expected.items():
        result = alice_hydra(*args)
        assert result.exit_code == 0, (args, result.output)
        assert text in result.stdout, (args, result.stdout)


def test_preference_pairs_are_uploaded_and_sampled_with_their_kind(alice_hydra: Shell, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Q{k}", "chosen": f"A{k}", "rejected": "No."}) + "\n"
                             for k in range(8)))
    made = _document(alice_hydra("datasets", "upload", str(pairs), "--kind", "preference", "--json"))
    assert (made["kind"], made["columns"]) == ("preference", {"prompt": "prompt", "chosen": "chosen",
                                                              "rejected": "rejected"})
    sample = _document(alice_hydra("datasets", "sample", "--pairs", "--json"))
    assert (sample["source"], sample["kind"], sample["status"]) == ("sample_pairs", "preference", "tokenizing")
    listed = alice_hydra("datasets", "list")
    assert "preference" in listed.stdout
    assert alice_hydra("datasets", "sample", "--pairs", "--chat").exit_code == 2
