"""The API's resources as `Hydra` hangs them off the client by name: `Datasets`, `Models`, `Experiments` and
`Trials`, one method per endpoint, each calling through the client's `Connection`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hydra_client.connection import Connection, HydraError, Progress, _query


def _wait(poll: Callable[[], dict[str, Any]], *, done: Callable[[dict[str, Any]], bool], timeout: float,
          interval: float, what: str) -> dict[str, Any]:
    """Call `poll` every `interval` seconds until `done` holds for its answer (returned), for at most `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        answer = poll()
        if done(answer):
            return answer
        if time.monotonic() + interval > deadline:
            raise HydraError(None, f"{what} was not done after {timeout:g} s.")
        time.sleep(interval)


class Resource:
    def __init__(self, client: Connection) -> None:
        self.client = client


class Datasets(Resource):
    """The team's datasets: corpora and instruction data with their trained tokenizers."""

    def list(self, status: str | None = None, name: str | None = None) -> list[dict[str, Any]]:
        """Every dataset of the team, newest first (`status`: only tokenizing, ready or failed ones; `name`: only
        those of this name, in any case)."""
        return list(self.client.paginate("/datasets", {"status": status, "name": name}))

    def get(self, dataset_id: int) -> dict[str, Any]:
        return self.client.get(f"/datasets/{int(dataset_id)}")

    def find(self, dataset: int | str) -> dict[str, Any]:
        """The dataset whose id, or else whose name, is `dataset` (a name of digits only is read as an id; a name
        in another case matches when it is the only one). HydraError 404 when the team has none of that name, and
        409 when several match (their ids said)."""
        if isinstance(dataset, int) or str(dataset).strip().isdigit():
            return self.get(int(dataset))
        name = str(dataset).strip()
        found = self.list(name=name)
        exact = [d for d in found if d["name"] == name]
        found = exact if len(exact) == 1 else found
        if not found:
            raise HydraError(404, f"The team has no dataset named {name!r}: hydra datasets list shows them.")
        if len(found) > 1:
            ids = ", ".join(str(d["id"]) for d in found)
            raise HydraError(409, f"{len(found)} datasets of the team are named {name!r} (ids {ids}): give the id.")
        return found[0]

    def preview(self, dataset_id: int) -> dict[str, Any]:
        """A ready dataset's first text and its tokens, or its first examples (409 until it is ready)."""
        return self.client.get(f"/datasets/{int(dataset_id)}/preview")

    def upload(self, path: str | os.PathLike[str], name: str = "", kind: str = "", vocab_size: int = 2048,
               val_fraction: float = 0.1, columns: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Upload a UTF-8 text corpus, or instruction, chat or preference data (.jsonl, .json, .csv, .parquet;
        `kind`: what its rows hold, empty to detect it; `columns`: the column of each role whose column is not
        found by its common names, e.g. ``{"prompt": "title"}``). The dataset comes back tokenizing: `wait` for it."""
        path = Path(path)
        fields = {"source": "upload", "name": name, "kind": kind, "columns": json.dumps(dict(columns or {})),
                  "vocab_size": str(vocab_size), "val_fraction": str(val_fraction)}
        with path.open("rb") as handle:
            return self.client.call("POST", "/datasets", data=fields,
                                    files={"file": (path.name, handle, "application/octet-stream")})

    def sample(self, chat: bool = False, name: str = "", vocab_size: int = 2048, val_fraction: float = 0.1,
               pairs: bool = False) -> dict[str, Any]:
        """The server's built-in sample: a text corpus, with `chat` a small chat dataset, or with `pairs` small
        preference pairs (a prompt, a chosen and a rejected answer) for DPO."""
        if chat and pairs:
            raise ValueError("choose one sample: chat or pairs")
        source = "sample_chat" if chat else "sample_pairs" if pairs else "sample"
        fields = {"source": source, "name": name, "vocab_size": str(vocab_size), "val_fraction": str(val_fraction)}
        return self.client.call("POST", "/datasets", data=fields)

    def wait(self, dataset_id: int, timeout: float = 600.0, interval: float = 1.0) -> dict[str, Any]:
        """Poll the dataset until its tokenizer is trained (returned), or raise `HydraError` with the reason
        it failed."""
        dataset = _wait(lambda: self.get(dataset_id), done=lambda d: d["status"] != "tokenizing", timeout=timeout,
                        interval=interval, what=f"Tokenizing dataset {dataset_id}")
        if dataset["status"] != "ready":
            raise HydraError(None, f"Dataset {dataset['name']} failed: {dataset['message'] or dataset['status']}")
        return dataset


class Models(Resource):
    """The server's model catalog: checkpoints that experiments may start from."""

    def list(self) -> list[dict[str, Any]]:
        return self.client.get("/models")

    def get(self, checkpoint_id: int) -> dict[str, Any]:
        return self.client.get(f"/models/{int(checkpoint_id)}")


def space_text(space: str | os.PathLike[str] | Mapping[str, Any]) -> str | dict[str, Any]:
    """A search space as the API takes it: a mapping as is, a path's text, or YAML/JSON text as is (a string
    that names an existing file is read)."""
    if isinstance(space, Mapping):
        return dict(space)
    if isinstance(space, os.PathLike):
        return Path(space).read_text(encoding="utf-8")
    if "\n" not in space and len(space) < 4096 and Path(space).is_file():
        return Path(space).read_text(encoding="utf-8")
    return space


class Experiments(Resource):
    """The team's experiments: search spaces over a dataset, each point a trial."""

    def list(self, **filters: Any) -> list[dict[str, Any]]:
        """Every experiment the page's filters keep: ``q`` (words, ``tag:x``), ``tag``, ``dataset``, ``model``,
        ``status`` and ``sort`` (newest, oldest, name, best...)."""
        return list(self.client.paginate("/experiments", filters))

    def create(self, space: str | os.PathLike[str] | Mapping[str, Any], *, name: str, dataset: int,
               launch: bool = False, **fields: Any) -> dict[str, Any]:
        """Create an experiment from a search space (see `space_text`) as the new-experiment form does, and
        launch it with `launch`. `fields`: strategy, n_trials, budget_unit, budget, eval_every, seed,
        memory_budget_mib, early_stop_patience, priority, holdout_bytes, chat_template, objective (sft or dpo)."""
        body = {"name": name, "dataset": int(dataset), "space": space_text(space), "launch": launch,
                **_query(fields)}
        return self.client.post("/experiments", body)

    def preview(self, space: str | os.PathLike[str] | Mapping[str, Any], *, name: str, dataset: int,
                **fields: Any) -> dict[str, Any]:
        """The trials the experiment would start with and their memory plans, without creating it. A large
        sweep answers ``status`` preparing with an ``id``: poll `preview_get`."""
        body = {"name": name, "dataset": int(dataset), "space": space_text(space), **_query(fields)}
        return self.client.post("/experiments/preview", body)

    def preview_get(self, preview_id: int) -> dict[str, Any]:
        return self.client.get(f"/experiments/previews/{int(preview_id)}")

    def get(self, experiment_id: int) -> dict[str, Any]:
        return self.client.get(f"/experiments/{int(experiment_id)}")

    def space(self, experiment_id: int) -> dict[str, Any]:
        """The experiment's search space with its model: what `create` takes to make the same experiment."""
        return self.client.get(f"/experiments/{int(experiment_id)}/space")

    def trials(self, experiment_id: int, sort: str = "number", updated_since: str | None = None,
               ) -> list[dict[str, Any]]:
        """The experiment's trials (`sort`: number, best or status); only those changed after `updated_since`
        (an ISO 8601 time, the largest ``updated`` seen) when given."""
        return self.client.get(f"/experiments/{int(experiment_id)}/trials", sort=sort, updated_since=updated_since)

    def clone(self, experiment_id: int, **changes: Any) -> dict[str, Any]:
        """A new experiment like this one with `changes` (any field of `create`, ``space`` too; ``launch``)."""
        if "space" in changes and changes["space"] is not None:
            changes["space"] = space_text(changes["space"])
        return self.client.post(f"/experiments/{int(experiment_id)}/clone", changes)

    def launch(self, experiment_id: int) -> dict[str, Any]:
        """Send every trial not launched yet to the scheduler: ``{"count", "detail"}``."""
        return self.client.post(f"/experiments/{int(experiment_id)}/launch")

    def cancel(self, experiment_id: int) -> dict[str, Any]:
        return self.client.post(f"/experiments/{int(experiment_id)}/cancel")

    def retry_failed(self, experiment_id: int) -> dict[str, Any]:
        return self.client.post(f"/experiments/{int(experiment_id)}/retry-failed")


class Trials(Resource):
    """One point of an experiment's search space: its training, its metrics and its model."""

    def get(self, trial_id: int) -> dict[str, Any]:
        return self.client.get(f"/trials/{int(trial_id)}")

    def metrics(self, trial_id: int, since: int = -1) -> dict[str, Any]:
        """The trial and its current attempt's steps and evaluations after step `since`; pass the answer's
        ``next`` as `since` to get only what came after."""
        return self.client.get(f"/trials/{int(trial_id)}/metrics", since=since)

    def pause(self, trial_id: int) -> dict[str, Any]:
        return self.client.post(f"/trials/{int(trial_id)}/pause")

    def resume(self, trial_id: int) -> dict[str, Any]:
        return self.client.post(f"/trials/{int(trial_id)}/resume")

    def cancel(self, trial_id: int) -> dict[str, Any]:
        return self.client.post(f"/trials/{int(trial_id)}/cancel")

    def retry(self, trial_id: int) -> dict[str, Any]:
        return self.client.post(f"/trials/{int(trial_id)}/retry")

    def continue_(self, trial_id: int, steps: int, lr: float, warmup_steps: int = 0, decay: str = "cosine",
                  ) -> dict[str, Any]:
        """Train a finished trial `steps` more steps at peak learning rate `lr`, from its last checkpoint."""
        body = {"steps": steps, "lr": lr, "warmup_steps": warmup_steps, "decay": decay}
        return self.client.post(f"/trials/{int(trial_id)}/continue", body)

    def downloads(self, trial_id: int) -> list[dict[str, Any]]:
        """What the trial's model downloads are: ``{"kind", "title", "about", "content_bytes", "status", ...}``
        for its model (a LoRA trial's merged model) and, for a LoRA trial, its adapter alone."""
        return self.client.get(f"/trials/{int(trial_id)}/downloads")

    def archive(self, trial_id: int, kind: str = "model") -> dict[str, Any]:
        """Ask the server to pack the trial's model (weights, config, tokenizer), or with ``kind="adapter"`` a LoRA
        trial's adapter alone, into a .tar.gz."""
        return self.client.post(f"/trials/{int(trial_id)}/archive?kind={kind}")

    def archive_status(self, trial_id: int, kind: str = "model") -> dict[str, Any]:
        """The archive's state: ``status``, and while it is preparing ``packed_bytes`` of ``total_bytes``."""
        return self.client.get(f"/trials/{int(trial_id)}/archive", kind=kind)

    def download(self, trial_id: int, dest_dir: str | os.PathLike[str] = ".", progress: Progress | None = None,
                 timeout: float = 600.0, interval: float = 1.0, kind: str = "model",
                 packing: Progress | None = None) -> Path:
        """Have the trial's model (or with ``kind="adapter"`` its LoRA adapter) packed, wait until it is, and
        stream the .tar.gz into `dest_dir`; returns its path. `packing` is called with the bytes packed so far
        and the total while the server packs, `progress` with the bytes received so far and the total."""
        packed = self.archive(trial_id, kind)
        if packed["status"] == "failed":  # an earlier packing failed: asking again starts it anew
            packed = self.archive(trial_id, kind)

        def poll() -> dict[str, Any]:
            answer = self.archive_status(trial_id, kind)
            if packing is not None and answer["status"] == "preparing":
                packing(answer.get("packed_bytes") or 0, answer.get("total_bytes"))
            return answer

        if not (packed["status"] == "ready" and packed.get("download")):
            packed = _wait(poll, done=lambda a: a["status"] != "preparing", timeout=timeout, interval=interval,
                           what=f"Packing trial {trial_id}'s {kind}")
        if packed["status"] != "ready" or not packed.get("download"):
            raise HydraError(None, f"Trial {trial_id}'s {kind} could not be packed: "
                                   f"{packed.get('message') or packed['status']}")
        if packing is not None and packed.get("total_bytes") is not None:
            packing(packed["total_bytes"], packed["total_bytes"])
        return self.client.download_file(packed["download"], dest_dir,
                                         fallback_name=f"trial-{trial_id}-{kind}.tar.gz", progress=progress)

    def generate(self, trial_id: int, prompt: str, **settings: Any) -> dict[str, Any]:
        """Ask the trial's model to continue `prompt` (`settings`: max_new_tokens, temperature, top_p, seed);
        the answer is pending: poll `generation`."""
        return self.client.post(f"/trials/{int(trial_id)}/generate", {"prompt": prompt, **_query(settings)})

    def generation(self, trial_id: int, generation_id: int) -> dict[str, Any]:
        return self.client.get(f"/trials/{int(trial_id)}/generations/{int(generation_id)}")
