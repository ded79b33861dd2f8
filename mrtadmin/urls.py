from django.contrib import admin
from django.urls import include, path

from queues.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("django-admin/", admin.site.urls),
    path("", include("queues.urls")),
]
