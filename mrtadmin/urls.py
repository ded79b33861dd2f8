from django.contrib import admin
from django.urls import include, path

from queues.web.downloads import download
from queues.web.health import favicon, healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", favicon, name="favicon"),
    path("downloads/<str:name>", download, name="download"),
    path("django-admin/", admin.site.urls),
    path("", include("queues.urls")),
]

handler500 = "queues.web.faults.server_error"
