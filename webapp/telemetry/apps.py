from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "webapp.telemetry"
    label = "telemetry"
    verbose_name = "Telemetry (metrics, unit spans, device samples)"
