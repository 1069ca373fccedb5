from django.apps import AppConfig


class GroundConfig(AppConfig):
    name = "webapp.ground"
    label = "experiments"  # the database's name for these models' tables and history (see the package)
    verbose_name = "Experiments and trials"

    def ready(self) -> None:
        from webapp.nul_text import install_on_connections

        # Every process that reads or writes the records (web, web worker, ingest) opens its connections
        # with NUL replaced in what a machine sends: `webapp.nul_text`.
        install_on_connections()
