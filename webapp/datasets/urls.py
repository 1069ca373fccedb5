from django.urls import path

from webapp.datasets import views

urlpatterns = [
    path("datasets/", views.dataset_list, name="dataset_list"),
    path("datasets/<int:dataset_id>/", views.dataset_detail, name="dataset_detail"),
    path("datasets/<int:dataset_id>/delete/", views.dataset_delete, name="dataset_delete"),
]
