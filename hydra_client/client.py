"""`Hydra`: one method per endpoint of a Hydra server's REST API (``/api/v1/``), on a `requests.Session`.

Every call authenticates with a personal access token (``Authorization: Bearer hyd_…``) and acts in the team
given to `Hydra` (the ``X-Hydra-Team`` header), else in the token owner's current team. The resources hang off
the client by name, as the API groups them::

    hydra = Hydra("https://hydra.example.org", token="hyd_…")
    dataset = hydra.datasets.wait(hydra.datasets.sample()["id"])
    experiment = hydra.experiments.create("space.yaml", name="lr sweep", dataset=dataset["id"], launch=True)
    path = hydra.trials.download(trial_id, "models/")

A refused call raises `HydraError` with the server's status, its ``detail`` and its field errors; a server out
of reach raises `HydraUnreachable`. A call answered 429 (too many requests with this token) waits as long as
the server's Retry-After says and tries again, a few times, before it raises.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import requests
import urllib3

API_PREFIX = "/api/v1"
TEAM_HEADER = "X-Hydra-Team"
PAGE_SIZE = 100  # the largest page the server gives
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRIES = 3  # tries again after a 429 this many times
MAX_RETRY_AFTER_S = 60.0  # the server's rate limit counts per minute: never a longer wait than that
CHUNK_BYTES = 1 << 16
ENDED = frozenset({"finished", "pruned", "failed", "cancelled"})  # trial statuses that no longer change
SUCCEEDED = frozenset({"finished", "pruned"})  # ended with an exported model

Progress = Callable[[int, int | None], None]  # bytes so far, and the total when the server says it
log = logging.getLogger("hydra_client")


class HydraError(Exception):
    """The server refused a call (`status`, its ``detail`` and field ``errors``), or work it did failed
    (`status` None: a dataset whose tokenizer failed, a model that could not be packed, a wait that ran out)."""

    def __init__(self, status: int | None, detail: str, errors: Mapping[str, list[str]] | None = None, *,
                 retry_after: float | None = None) -> None:
        self.status = status
        self.detail = detail
        self.errors = {field: list(messages) for field, messages in (errors or {}).items()}
        self.retry_after = retry_after
        super().__init__(self.describe())

    def describe(self) -> str:
        """The detail, then each field error named by its field (indented). A detail that only repeats the field
        errors (a form's messages, joined) gives way to them, so that nothing is said twice."""
        fields = [message if field == "__all__" else f"{field}: {message}"
                  for field, messages in self.errors.items() for message in messages]
        repeated = " ".join(m for messages in self.errors.values() for m in messages)
        if fields and self.detail.strip() == repeated.strip():
            head, rest = fields[0], fields[1:]
        else:
            head, rest = self.detail, fields
        return "\n".join([head, *("  " + line.replace("\n", "\n    ") for line in rest)])


class HydraUnreachable(HydraError):
    """The server could not be reached, or did not answer in time."""

    def __init__(self, detail: str) -> None:
        super().__init__(None, detail)


def api_base(url: str) -> str:
    """The server's root URL without a trailing slash or the API's prefix, checked to be HTTP(S)."""
    url = url.strip().rstrip("/")
    url = url.removesuffix(API_PREFIX)
    if not re.match(r"https?://[^/]+", url):
        raise ValueError(f"{url or '(empty)'} is not a server address: give it as http://host:port or https://host.")
    return url


def sends_in_clear(url: str) -> bool:
    """Whether requests to the server at `url` (an `api_base`) cross a network unencrypted: plain http:// to a
    host other than this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    parsed = urlsplit(url)
    if parsed.scheme != "http":
        return False
    host = (parsed.hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return True


def _header(value: str, what: str) -> str:
    """`value` stripped, checked to be printable ASCII as an HTTP header takes it (a token pasted with a stray
    character would otherwise fail deep inside the HTTP library)."""
    value = value.strip()
    if not value.isascii() or not value.isprintable():
        raise ValueError(f"The {what} has characters no {what} has: paste it again, as plain text.")
    return value


def _retry_after(response: requests.Response) -> float:
    """The seconds the server asks to wait (its Retry-After), within 0 to `MAX_RETRY_AFTER_S`."""
    try:
        seconds = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def error_from(response: requests.Response) -> HydraError:
    """The `HydraError` of a refused answer: the API's ``{"detail", "errors"}``, or a plain line for anything
    else (a proxy's page, a server that is not Hydra)."""
    retry_after = _retry_after(response) if response.status_code == 429 else None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        errors = body.get("errors") if isinstance(body.get("errors"), dict) else {}
        return HydraError(response.status_code, body["detail"], errors, retry_after=retry_after)
    detail = f"HTTP {response.status_code} {response.reason or ''}".strip()
    if response.status_code == 404:
        detail += f" at {response.url}: is this the address of a Hydra server?"
    return HydraError(response.status_code, detail, retry_after=retry_after)


def attachment_name(header: str, fallback: str) -> str:
    """The file name a Content-Disposition header gives, reduced to a bare name (no folders)."""
    match = re.search(r"filename\*\s*=\s*(?:[\w-]+'[\w-]*')?\"?([^\";]+)", header, re.IGNORECASE)
    if match:
        name = unquote(match.group(1))
    else:
        match = re.search(r"filename\s*=\s*\"?([^\";]+)", header, re.IGNORECASE)
        name = match.group(1) if match else ""
    name = name.replace("\\", "/").rsplit("/", 1)[-1].strip()
    return name if name not in ("", ".", "..") else fallback


def _rewind(files: Mapping[str, Any] | None) -> None:
    """Put every file of a multipart body back at its start, so that a retried upload sends it whole."""
    for value in (files or {}).values():
        handle = value[1] if isinstance(value, tuple) else value
        if hasattr(handle, "seek"):
            handle.seek(0)


def _query(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Query parameters without the unset ones (None), so that the server applies its defaults."""
    return {key: value for key, value in (params or {}).items() if value is not None}


class Hydra:
    """A Hydra server's API as `token` sees it, in `team` (an id; None: the token owner's current team).

    `timeout` is the seconds any one answer may take to start (a download's chunks each get as long);
    `retries` how many times a call answered 429 waits and tries again.
    """

    def __init__(self, url: str, token: str, team: int | str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES) -> None:
        self.url = api_base(url)
        self.timeout = timeout
        self.retries = retries
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {_header(token, 'token')}",
                                     "Accept": "application/json", "User-Agent": "hydra-client/1"})
        if team is not None and str(team).strip():
            self.session.headers[TEAM_HEADER] = _header(str(team), "team")
        self.datasets = Datasets(self)
        self.models = Models(self)
        self.experiments = Experiments(self)
        self.trials = Trials(self)

    def __enter__(self) -> Hydra:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    def api_url(self, path: str) -> str:
        """The absolute URL of an API path, given with or without the ``/api/v1`` prefix."""
        path = "/" + path.lstrip("/")
        return self.url + (path if path.startswith(API_PREFIX + "/") else API_PREFIX + path)

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None,
                data: Mapping[str, Any] | None = None, files: Mapping[str, Any] | None = None,
                stream: bool = False) -> requests.Response:
        """Send one call and return its answer, or raise `HydraError` / `HydraUnreachable`; waits out a 429 up
        to `retries` times."""
        url = self.api_url(path)
        attempt = 0
        while True:
            _rewind(files)
            try:
                response = self.session.request(method, url, params=_query(params), json=json, data=data,
                                                files=files, stream=stream, timeout=self.timeout)
            except requests.Timeout:
                raise HydraUnreachable(f"{self.url} did not answer within {self.timeout:g} s.") from None
            except requests.RequestException as error:
                raise HydraUnreachable(f"{self.url} cannot be reached: {_reason(error)}") from None
            if response.status_code == 429 and attempt < self.retries:
                response.close()
                wait = _retry_after(response)
                log.warning("Too many requests with this token: trying again in %g s.", wait)
                time.sleep(wait)
                attempt += 1
                continue
            if response.status_code < 400:
                return response
            error = error_from(response)
            response.close()
            del response  # the error's traceback may outlive the call: it must not hold the connection open
            raise error

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """`request`, and the answer's JSON."""
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise HydraError(response.status_code, f"The answer to {method} {path} is not JSON: is {self.url} "
                                                   "a Hydra server?") from None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, json=body if body is not None else {})

    def paginate(self, path: str, params: Mapping[str, Any] | None = None, page_size: int = PAGE_SIZE,
                 ) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list (``{"items", "count"}``), fetching one page at a time as it goes."""
        offset = 0
        while True:
            page = self.call("GET", path, params={**(params or {}), "limit": page_size, "offset": offset})
            items = page["items"]
            yield from items
            offset += len(items)
            if not items or offset >= page["count"]:
                return

    def download_file(self, path: str, dest_dir: str | os.PathLike[str], *, fallback_name: str,
                      progress: Progress | None = None) -> Path:
        """Stream the file at `path` into `dest_dir` under the name the server gives it; written beside as a
        ``.part`` file and renamed once complete, so that a broken download never looks like a whole one."""
        folder = Path(dest_dir)
        folder.mkdir(parents=True, exist_ok=True)
        with self.request("GET", path, stream=True) as response:
            name = attachment_name(response.headers.get("Content-Disposition", ""), fallback_name)
            total = int(response.headers["Content-Length"]) if "Content-Length" in response.headers else None
            target, partial = folder / name, folder / f".{name}.part"
            done = 0
            if progress:
                progress(done, total)
            try:
                with partial.open("wb") as out:
                    # The bytes as sent: a proxy's Content-Encoding must not turn the .tar.gz into a .tar.
                    for chunk in response.raw.stream(CHUNK_BYTES, decode_content=False):
                        out.write(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, total)
            except (requests.RequestException, urllib3.exceptions.HTTPError) as error:
                partial.unlink(missing_ok=True)
                raise HydraUnreachable(f"The download from {self.url} broke off: {_reason(error)}") from None
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        if total is not None and done != total:
            partial.unlink(missing_ok=True)
            raise HydraUnreachable(f"The download from {self.url} broke off after {done} of {total} bytes.")
        partial.replace(target)
        return target

    def me(self) -> dict[str, Any]:
        """The token's user, their teams, the team the calls act in, and the token's scope and expiry."""
        return self.get("/me")

    def leaderboard(self, dataset: int | str, metric: str | None = None, holdout: int | None = None,
                    limit: int | None = None) -> dict[str, Any]:
        """The team's best trials on a dataset (its id or name, as `Datasets.find` takes it) by `metric` (bpb,
        val_ppl or val_loss; on a preference dataset val_loss, reward_accuracy, reward_margin or bpb; None: the
        board's default), and each team's best."""
        dataset_id = dataset if isinstance(dataset, int) else self.datasets.find(dataset)["id"]
        return self.get(f"/leaderboards/{int(dataset_id)}", metric=metric, holdout=holdout, limit=limit)

    def queue(self, page: int = 1) -> dict[str, Any]:
        """The lab queue: the devices, what they run, and why the waiting trials wait (one page of them)."""
        return self.get("/queue", page=page)


def _reason(error: BaseException) -> str:
    """The innermost reason of a requests error ("Connection refused"), without urllib3's retry wording."""
    inner = error
    for _ in range(8):
        deeper = getattr(inner, "reason", None)
        if not isinstance(deeper, BaseException) and inner.args and isinstance(inner.args[0], BaseException):
            deeper = inner.args[0]
        if not isinstance(deeper, BaseException) or deeper is inner:
            break
        inner = deeper
    text = str(inner)
    match = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    return match.group(1).strip() if match else (text or type(error).__name__)


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
    def __init__(self, client: Hydra) -> None:
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
