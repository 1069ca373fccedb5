"""The ``hydra`` command's subcommands, a module per group of commands (datasets and models, experiments,
trials and the lab), and what they share (`common`); `hydra_client.cli` puts them under its root group."""
