from django.urls import path

from webapp import ids  # noqa: F401 -- registers the <id:...> converter
from webapp.datasets import views

urlpatterns = [
    path("datasets/", views.dataset_list, name="dataset_list"),
    path("datasets/<id:dataset_id>/", views.dataset_detail, name="dataset_detail"),
    path("datasets/<id:dataset_id>/delete/", views.dataset_delete, name="dataset_delete"),
]
