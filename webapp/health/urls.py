from django.urls import path

from webapp.health import views

urlpatterns = [
    path("health", views.health_status, name="health_status"),
    path("health/", views.health_page, name="health"),
    path("health.json", views.health_json, name="health_json"),
]
