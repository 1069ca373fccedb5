"""A Python client and the ``hydra`` command line for a Hydra server's REST API (``/api/v1/``).

It imports neither Django nor the server's code, nor torch: it runs on any laptop with ``requests``, ``click``
and ``tqdm``.

    from hydra_client import Hydra
    hydra = Hydra("https://hydra.example.org", token="hyd_…")
    for dataset in hydra.datasets.list():
        print(dataset["id"], dataset["name"], dataset["status"])
"""

from hydra_client.client import Hydra
from hydra_client.connection import HydraError, HydraUnreachable

__all__ = ["Hydra", "HydraError", "HydraUnreachable"]
