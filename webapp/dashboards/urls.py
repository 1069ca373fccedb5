from django.urls import path

from webapp import ids  # noqa: F401 -- registers the <id:...> converter
from webapp.dashboards import views

urlpatterns = [
    path("experiments/<id:experiment_id>/curves/", views.experiment_curves, name="dashboard_curves"),
    path("experiments/<id:experiment_id>/curves.json", views.experiment_curves_data, name="dashboard_curves_data"),
    path("experiments/<id:experiment_id>/devices/", views.experiment_devices, name="dashboard_devices"),
    path("experiments/<id:experiment_id>/devices.json", views.experiment_devices_data,
         name="dashboard_devices_data"),
    path("experiments/<id:experiment_id>/metrics.csv", views.experiment_metrics_csv, name="dashboard_metrics_csv"),
    path("trials/<id:trial_id>/plan/", views.trial_plan, name="dashboard_trial_plan"),
    path("trials/<id:trial_id>/curves.json", views.trial_curves_data, name="dashboard_trial_curves_data"),
    path("datasets/<id:dataset_id>/leaderboard/", views.dataset_leaderboard, name="dashboard_leaderboard"),
]
