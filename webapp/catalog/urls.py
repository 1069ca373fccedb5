from django.urls import path

from webapp import ids  # noqa: F401 -- registers the <id:...> converter
from webapp.catalog import views

urlpatterns = [
    path("catalog/", views.catalog_list, name="catalog_list"),
    path("catalog/register/", views.catalog_register, name="catalog_register"),
    path("catalog/import-gguf/", views.catalog_import_gguf, name="catalog_import_gguf"),
    path("catalog/add-smollm2/", views.catalog_add_smollm2, name="catalog_add_smollm2"),
    path("catalog/<id:checkpoint_id>/", views.checkpoint_detail, name="checkpoint_detail"),
    path("catalog/<id:checkpoint_id>/remove/", views.checkpoint_remove, name="checkpoint_remove"),
]
