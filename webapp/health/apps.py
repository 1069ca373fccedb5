from django.apps import AppConfig


class HealthConfig(AppConfig):
    name = "webapp.health"
    label = "health"
