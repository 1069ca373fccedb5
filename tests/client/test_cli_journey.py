"""The command line's whole journey against the real stack (`make run`'s devstack, real CPU workers): make a
token on the tokens page, then only ``hydra`` as a user runs it: log in, take the sample corpus (its tokenizer
trained by the web worker), create and launch a two-trial sweep of a micro GPT-2, watch it train to the end,
download the best model, and load it with transformers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import requests
import torch
from transformers import AutoModelForCausalLM

from tests.browser.devstack import DevStack

pytestmark = [pytest.mark.processes]

STEPS = 30
VOCAB = 512
SPACE = """\
model: {preset: gpt2-micro}
lr: {kind: categorical, values: [0.001, 0.003]}
batch_size: [2]
"""
COMMAND_TIMEOUT_S = 120.0
WATCH_TIMEOUT_S = 300.0


def _csrf(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, html[:2000]
    return found[1]


def _write_token(stack: DevStack) -> str:
    """Log in to the pages as the demo user and make a write token on the tokens page; its secret."""
    username, password = stack.demo_login()
    with requests.Session() as browser:
        form = browser.get(f"{stack.url}/login/", timeout=30)
        home = browser.post(f"{stack.url}/login/", timeout=30, data={
            "username": username, "password": password, "csrfmiddlewaretoken": _csrf(form.text)})
        assert home.url == f"{stack.url}/", home.text[:2000]
        form = browser.get(f"{stack.url}/account/tokens/", timeout=30)
        made = browser.post(f"{stack.url}/account/tokens/", timeout=30, data={
            "name": "laptop", "scope": "write", "days": "30", "csrfmiddlewaretoken": _csrf(form.text)})
    secret = re.search(r'<code id="token-secret">(hyd_[^<]+)</code>', made.text)
    assert made.status_code == 200 and secret, made.text[:2000]
    return secret[1]


class Terminal:
    """``python -m hydra_client.cli`` as a separate process, with a config file of its own and no HYDRA_*
    variables of the test's."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {key: value for key, value in os.environ.items() if not key.startswith("HYDRA_")}
        self.env["HYDRA_CONFIG"] = str(home / "hydra.json")

    def run(self, *args: str, input: str | None = None, timeout: float = COMMAND_TIMEOUT_S,
            ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "hydra_client.cli", *args], input=input, capture_output=True,
                              text=True, env=self.env, cwd=self.home, timeout=timeout)
        print(f"$ hydra {' '.join(args)}  -> exit {done.returncode}\n{done.stderr}")
        return done

    def json(self, *args: str, timeout: float = COMMAND_TIMEOUT_S) -> object:
        done = self.run(*args, "--json", timeout=timeout)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


def _unpack(archive: Path, into: Path) -> Path:
    """The model directory the downloaded .tar.gz holds."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (directory,) = into.iterdir()
    return directory


def test_a_model_is_trained_and_downloaded_from_the_command_line(devstack: DevStack, tmp_path: Path) -> None:
    hydra = Terminal(tmp_path)
    token = _write_token(devstack)
    login = hydra.run("login", devstack.url, input=token + "\n")
    assert login.returncode == 0, login.stderr
    assert (tmp_path / "hydra.json").stat().st_mode & 0o777 == 0o600

    dataset = hydra.json("datasets", "sample", "--vocab-size", str(VOCAB), "--wait")
    assert (dataset["status"], dataset["kind"]) == ("ready", "corpus")
    assert dataset["n_tokens"] > 0

    (tmp_path / "space.yaml").write_text(SPACE)
    experiment = hydra.json("experiments", "create", "space.yaml", "--name", "cli journey", "--dataset",
                            str(dataset["id"]), "--budget", str(STEPS), "--eval-every", "10", "--launch")
    assert experiment["trials"] == {"total": 2, "new": 0, "active": 2, "finished": 0, "failed": 0}

    watched = hydra.json("watch", str(experiment["id"]), "--interval", "1", timeout=WATCH_TIMEOUT_S)
    assert watched["ok"] is True
    trials = watched["trials"]
    assert [(t["status"], t["step"]) for t in trials] == [("finished", STEPS)] * 2
    assert sorted(t["params"]["lr"] for t in trials) == [0.001, 0.003]
    assert all(t["final_bpb"] is not None and t["val_bpb"] == t["final_bpb"] and 0 < t["val_bpb"] < 16
               and t["train_loss"] > 0 for t in trials), trials

    board = hydra.json("leaderboard", str(dataset["id"]))
    best = board["team"][0]
    assert sorted(row["trial_id"] for row in board["team"]) == sorted(t["id"] for t in trials)
    assert best["bpb"] == min(t["val_bpb"] for t in trials)

    downloaded = hydra.json("download", str(best["trial_id"]), "-o", "models")
    archive = Path(downloaded["path"])
    number = next(t["number"] for t in trials if t["id"] == best["trial_id"])
    assert (downloaded["number"], downloaded["kind"]) == (number, "model")
    assert archive.parent == tmp_path / "models"
    assert archive.name == f"cli_journey-trial-{number}-id-{best['trial_id']}-model.tar.gz"
    assert archive.stat().st_size == downloaded["size_bytes"] > 0
    model = AutoModelForCausalLM.from_pretrained(_unpack(archive, tmp_path / "model")).eval()
    assert model.config.vocab_size <= VOCAB
    tokens = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
    assert out.logits.shape == (1, 16, model.config.vocab_size)
    assert torch.isfinite(out.loss)

    # The README's sweep from Python, on the same server: it runs as printed, with this server and token.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", readme, re.S)[1]
    example = example.replace('"http://127.0.0.1:8000"', repr(devstack.url)).replace('"hyd_..."', repr(token))
    done = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, cwd=tmp_path,
                          timeout=COMMAND_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert [row.split()[0] for row in rows] == ["1", "2", "3", "4"], done.stdout
