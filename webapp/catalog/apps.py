"""The lab's catalog of pretrained checkpoints: directories under the server's models root that experiments
may start from. It is lab-wide (the models root is the server's, not a team's); any signed-in user reads it,
staff and catalog managers add and remove checkpoints, and the web worker checks or imports them off the
request."""
from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "webapp.catalog"
    label = "catalog"
    verbose_name = "Pretrained model catalog"
