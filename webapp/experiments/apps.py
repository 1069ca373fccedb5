from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    """Search spaces, planning, launching, the workers' reports and the pages. Its models are the ground's
    (`webapp.ground`), which keeps the label ``experiments``, so this app is known by another."""

    name = "webapp.experiments"
    label = "experiment_runs"
    verbose_name = "Experiments: planning, launching and running"
