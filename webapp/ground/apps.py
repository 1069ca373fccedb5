from django.apps import AppConfig


class GroundConfig(AppConfig):
    name = "webapp.ground"
    label = "experiments"  # the database's name for these models' tables and history (see the package)
    verbose_name = "Experiments and trials"
