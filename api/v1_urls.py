from __future__ import annotations

from django.urls import path, re_path

from api.views import api, not_found

urlpatterns = [
    path("", api.urls),
    re_path(r"^.*$", not_found),  # JSON 404 for unknown paths under /api/v1/
]
