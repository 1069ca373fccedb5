from django.urls import path

from webapp.labqueue import views

urlpatterns = [
    path("queue/", views.lab_queue, name="lab_queue"),
]
