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

from typing import Any

from hydra_client.connection import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, Connection, HydraError, HydraUnreachable
from hydra_client.resources import Datasets, Experiments, Models, Trials

__all__ = ["Hydra", "HydraError", "HydraUnreachable"]

ENDED = frozenset({"finished", "pruned", "failed", "cancelled"})  # trial statuses that no longer change
SUCCEEDED = frozenset({"finished", "pruned"})  # ended with an exported model


class Hydra(Connection):
    """A Hydra server's API as `token` sees it, in `team` (an id; None: the token owner's current team).

    `timeout` is the seconds any one answer may take to start (a download's chunks each get as long);
    `retries` how many times a call answered 429 waits and tries again.
    """

    def __init__(self, url: str, token: str, team: int | str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES) -> None:
        super().__init__(url, token, team, timeout, retries)
        self.datasets = Datasets(self)
        self.models = Models(self)
        self.experiments = Experiments(self)
        self.trials = Trials(self)

    def __enter__(self) -> Hydra:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
