from __future__ import annotations

from django.urls import path

from api.metrics import metrics_view

urlpatterns = [path("metrics", metrics_view, name="metrics")]
