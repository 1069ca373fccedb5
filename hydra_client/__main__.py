"""``python -m hydra_client``: the ``hydra`` command line."""

from hydra_client.cli import main

main()
