from __future__ import annotations

from django.urls import path

from packs.diagnosis import web

app_name = "diagnosis_pack"

urlpatterns = [
    path("diagnosis/new/", web.new_diagnosis, name="new"),
    path("diagnosis/<uuid:session_id>/bundle.zip", web.download_bundle, name="bundle"),
    path(
        "diagnosis/<uuid:session_id>/save-knowledge/",
        web.save_knowledge,
        name="save-knowledge",
    ),
]
