from django.contrib import admin
from django.urls import include, path

from queues.downloads import download
from queues.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("downloads/<str:name>", download, name="download"),
    path("django-admin/", admin.site.urls),
    path("", include("queues.urls")),
]
