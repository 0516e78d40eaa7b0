from __future__ import annotations

from django.urls import path

from ingest import views

app_name = "ingest"

urlpatterns = [
    path("alertmanager", views.alertmanager, name="alertmanager"),
    path("alerts", views.generic, name="alerts"),
]
