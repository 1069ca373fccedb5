from django.apps import AppConfig


class BackgroundConfig(AppConfig):
    name = "webapp.background"
    label = "background"
    verbose_name = "Background work of the web app"
